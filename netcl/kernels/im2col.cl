// im2col / col2im for convolution as GEMM (NCHW, any stride, padding, dilation, groups).
//
// im2col: cols[b, g, (c*KH + kh)*KW + kw, oh*OW + ow] = x[n0 + b, g*Cg + c, ih, iw]
//   (zero outside the image), ih = oh*SH - PH + kh*DH, iw = ow*SW - PW + kw*DW, for a chunk of
//   NB images starting at n0. Then y[n, g] (Kg x OH*OW) = w[g] (Kg x Cg*KH*KW) @ cols[n, g].
//   The row (b, g, r) starts at element b*SB + g*SG + r*SR of cols and holds OH*OW contiguous
//   values: (SB, SG, SR) = (G*R*P, R*P, P) is the per-image layout (NB, G, R, P);
//   (P, R*NB*P, NB*P) is the batch-inner layout (G, R, NB*P) whose rows run over all images
//   (the weight gradient's GEMM sums over its K = NB*P without a separate reduction).
//   im2col (GPUs): global (OH*OW, Cg + ones_row, NB*G); one work-item writes the KH*KW elements of one
//   input channel at one position (coalesced across positions).
//   im2col_rows (CPUs): global (R, NB*G); one work-item writes one whole row of OH*OW values as
//   runs (zeros / copied input row / zeros per oh), no div/mod inside the loop: PoCL vectorises
//   the copy and each row's input lines stay in L1.
//   ones_row=1 appends a row of ones (R = Cg*KH*KW + 1) so a bias column in the weight matrix
//   adds the bias inside the GEMM.
// col2im: gx[n0 + b, g*Cg + c, ih, iw] = sum over (kh, kw) with a valid output position of
//   cols[b, g, (c*KH + kh)*KW + kw, oh*OW + ow] (per-image layout): a gather, no atomics.
//   Layout: global (W, H, NB*C); one work-item per input element (GPUs); the taps as defines (below).
// col2im_plane (CPUs): the same sum; global (NB*C), one work-item owns one (b, c) input plane:
//   it zeroes it, then adds each of its KH*KW column rows back as unit-stride runs (the inverse of
//   im2col_rows: no div/mod in the loops, the plane stays in L1; nothing else writes the plane).
// weight_bias: wb[k, j] = j < R ? w[k, j] : b[k]: the (K, R+1) weight matrix with the bias as its
//   last column (pairs with ones_row above). global (R+1, K); one work-item copies one element.
//   Reads K*R + K values of w and b, writes K*(R+1): one launch instead of two strided copies.
// Every dtype of common.cl: elements are read with LOAD_T and written with STORE_T (float16 and
// bfloat16 storage: exact copies, col2im sums in ACC).

#include "common.cl"

#ifndef T
#define T float
#endif
#ifndef ACC
#define ACC T
#endif

__kernel void im2col(__global const T *x, const long x_off, __global T *cols, const long SB, const long SG,
                     const long SR, const int n0, const int NB, const int ones_row, const int C, const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int DH, const int DW, const int G)
{
    // one work-item per (position, input channel, image/group): it writes that channel's KH*KW rows
    // at its position (coalesced across positions); the index arithmetic is paid once, not per tap
    const int p = get_global_id(0);
    const int c = get_global_id(1);
    const int bg = get_global_id(2);
    const int Cg = C / G;
    if (p >= OH * OW || c >= Cg + ones_row || bg >= NB * G) return;
    const int b = bg / G, g = bg - (bg / G) * G;
    __global T *dst = cols + b * SB + g * SG + p;
    if (c == Cg) {   // the row of ones after the Cg*KH*KW data rows
        STORE_T(dst, (long)Cg * KH * KW * SR, (ACC)1);
        return;
    }
    const int oh = p / OW, ow = p - (p / OW) * OW;
    const __global T *xc = x + x_off + (((long)(n0 + b) * C) + (long)g * Cg + c) * H * W;
    dst += (long)c * KH * KW * SR;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = oh * SH - PH + kh * DH;
        const bool row_in = ih >= 0 && ih < H;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = ow * SW - PW + kw * DW;
            STORE_T(dst, (long)(kh * KW + kw) * SR,
                    (row_in && iw >= 0 && iw < W) ? LOAD_T(xc, (long)ih * W + iw) : (ACC)0);
        }
    }
}

__kernel void im2col_rows(__global const T *x, const long x_off, __global T *cols, const long SB, const long SG,
                          const long SR, const int n0, const int NB, const int ones_row, const int C,
                          const int H, const int W, const int OH, const int OW, const int KH, const int KW,
                          const int SH, const int SW, const int PH, const int PW, const int DH, const int DW,
                          const int G)
{
    const int r = get_global_id(0);
    const int bg = get_global_id(1);
    const int Cg = C / G;
    const int R = Cg * KH * KW + ones_row;
    if (r >= R || bg >= NB * G) return;
    const int b = bg / G, g = bg - (bg / G) * G;
    __global T *dst = cols + b * SB + g * SG + r * SR;
    const int P = OH * OW;
    if (ones_row && r == R - 1) {
        for (int i = 0; i < P; ++i) STORE_T(dst, i, (ACC)1);
        return;
    }
    const int c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
    const __global T *xc = x + x_off + (((long)(n0 + b) * C) + (long)g * Cg + c) * H * W;
    const int iw0 = kw * DW - PW;                       // iw = iw0 + ow*SW
    // valid ow range: 0 <= iw0 + ow*SW < W
    const int lo = iw0 >= 0 ? 0 : min(OW, (-iw0 + SW - 1) / SW);
    const int hi = iw0 >= W ? 0 : min(OW, (W - 1 - iw0) / SW + 1);
    for (int oh = 0; oh < OH; ++oh) {
        __global T *d = dst + oh * OW;
        const int ih = oh * SH - PH + kh * DH;
        if (ih < 0 || ih >= H || hi <= lo) {
            for (int ow = 0; ow < OW; ++ow) STORE_T(d, ow, (ACC)0);
            continue;
        }
        const __global T *src = xc + (long)ih * W + iw0;
        for (int ow = 0; ow < lo; ++ow) STORE_T(d, ow, (ACC)0);
        if (SW == 1) {
            for (int ow = lo; ow < hi; ++ow) STORE_T(d, ow, LOAD_T(src, ow));
        } else {
            for (int ow = lo; ow < hi; ++ow) STORE_T(d, ow, LOAD_T(src, ow * SW));
        }
        for (int ow = hi; ow < OW; ++ow) STORE_T(d, ow, (ACC)0);
    }
}

// col2im's taps: with TAP_KH ... TAP_DW defined (the GPU plan does) kernel size, stride, padding and
// dilation are compile-time constants, so the per-tap remainders and quotients by SH, SW become shifts
// or multiplies: runtime integer division bound this gather on the H200 (~4x its memory time).
#ifdef TAP_KH
#define C2I_KH TAP_KH
#define C2I_KW TAP_KW
#define C2I_SH TAP_SH
#define C2I_SW TAP_SW
#define C2I_PH TAP_PH
#define C2I_PW TAP_PW
#define C2I_DH TAP_DH
#define C2I_DW TAP_DW
#else
#define C2I_KH KH
#define C2I_KW KW
#define C2I_SH SH
#define C2I_SW SW
#define C2I_PH PH
#define C2I_PW PW
#define C2I_DH DH
#define C2I_DW DW
#endif

__kernel void col2im(__global const T *cols, __global T *gx, const long gx_off, const int n0, const int NB,
                     const int C, const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int DH, const int DW, const int G)
{
    const int iw = get_global_id(0);
    const int ih = get_global_id(1);
    const int bc = get_global_id(2);
    if (iw >= W || ih >= H || bc >= NB * C) return;
    const int b = bc / C, c = bc - (bc / C) * C;
    const int Cg = C / G, g = c / Cg, cl = c - g * Cg;
    const int R = Cg * C2I_KH * C2I_KW;
    const __global T *cb = cols + ((long)b * G + g) * R * OH * OW;
    ACC acc = (ACC)0;
    for (int kh = 0; kh < C2I_KH; ++kh) {
        const int th = ih + C2I_PH - kh * C2I_DH;
        if (th < 0 || th % C2I_SH) continue;
        const int oh = th / C2I_SH;
        if (oh >= OH) continue;
        for (int kw = 0; kw < C2I_KW; ++kw) {
            const int tw = iw + C2I_PW - kw * C2I_DW;
            if (tw < 0 || tw % C2I_SW) continue;
            const int ow = tw / C2I_SW;
            if (ow >= OW) continue;
            acc += LOAD_T(cb, ((long)(cl * C2I_KH + kh) * C2I_KW + kw) * OH * OW + oh * OW + ow);
        }
    }
    STORE_T(gx, gx_off + ((((long)(n0 + b) * C) + c) * H + ih) * W + iw, acc);
}

__kernel void col2im_plane(__global const T *cols, __global T *gx, const long gx_off, const int n0, const int NB,
                           const int C, const int H, const int W, const int OH, const int OW,
                           const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                           const int DH, const int DW, const int G)
{
    const int bc = get_global_id(0);
    if (bc >= NB * C) return;
    const int b = bc / C, c = bc - (bc / C) * C;
    const int Cg = C / G, g = c / Cg, cl = c - g * Cg;
    const int P = OH * OW;
    const __global T *cb = cols + (((long)b * G + g) * Cg + cl) * KH * KW * P;
    __global T *gp = gx + gx_off + ((long)(n0 + b) * C + c) * H * W;
    for (int i = 0; i < H * W; ++i) STORE_T(gp, i, (ACC)0);
    for (int kh = 0; kh < KH; ++kh) {
        for (int kw = 0; kw < KW; ++kw) {
            const __global T *src = cb + (kh * KW + kw) * P;
            const int iw0 = kw * DW - PW;
            const int lo = iw0 >= 0 ? 0 : min(OW, (-iw0 + SW - 1) / SW);
            const int hi = iw0 >= W ? 0 : min(OW, (W - 1 - iw0) / SW + 1);
            for (int oh = 0; oh < OH; ++oh) {
                const int ih = oh * SH - PH + kh * DH;
                if (ih < 0 || ih >= H) continue;
                __global T *d = gp + (long)ih * W + iw0;
                const __global T *s = src + oh * OW;
                for (int ow = lo; ow < hi; ++ow) STORE_T(d, ow * SW, LOAD_T(d, ow * SW) + LOAD_T(s, ow));
            }
        }
    }
}

__kernel void weight_bias(__global const T *w, const long w_off, __global const T *b, const long b_off,
                          __global T *wb, const int K, const int R)
{
    const int j = get_global_id(0);
    const int k = get_global_id(1);
    if (j > R || k >= K) return;
    STORE_T(wb, (long)k * (R + 1) + j, j < R ? LOAD_T(w, w_off + (long)k * R + j) : LOAD_T(b, b_off + k));
}
