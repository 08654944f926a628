// im2col / col2im for convolution as GEMM (NCHW, any stride, padding, dilation, groups).
//
// im2col: cols[b, g, (c*KH + kh)*KW + kw, oh*OW + ow] = x[n0 + b, g*Cg + c, ih, iw]
//   (zero outside the image), ih = oh*SH - PH + kh*DH, iw = ow*SW - PW + kw*DW, for a chunk of
//   NB images starting at n0. Then y[n, g] (Kg x OH*OW) = w[g] (Kg x Cg*KH*KW) @ cols[n, g].
//   Layout: global (OH*OW, Cg*KH*KW, NB*G); one work-item writes one column element (reads are
//   coalesced along ow on GPUs, writes fully coalesced). ones_row=1 appends a row of ones
//   (R = Cg*KH*KW + 1) so a bias column in the weight matrix adds the bias inside the GEMM.
// col2im: gx[n0 + b, g*Cg + c, ih, iw] = sum over (kh, kw) with a valid output position of
//   cols[b, g, (c*KH + kh)*KW + kw, oh*OW + ow]: a gather, no atomics.
//   Layout: global (W, H, NB*C); one work-item per input element.

#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#ifndef T
#define T float
#endif
#ifndef ACC
#define ACC T
#endif

__kernel void im2col(__global const T *x, const long x_off, __global T *cols, const int n0, const int NB,
                     const int ones_row, const int C, const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int DH, const int DW, const int G)
{
    const int p = get_global_id(0);
    const int r = get_global_id(1);
    const int bg = get_global_id(2);
    const int Cg = C / G;
    const int R = Cg * KH * KW + ones_row;
    if (p >= OH * OW || r >= R || bg >= NB * G) return;
    if (ones_row && r == R - 1) {
        cols[(((long)bg * R) + r) * OH * OW + p] = (T)1;
        return;
    }
    const int b = bg / G, g = bg - (bg / G) * G;
    const int c = r / (KH * KW), kh = (r / KW) % KH, kw = r % KW;
    const int oh = p / OW, ow = p - (p / OW) * OW;
    const int ih = oh * SH - PH + kh * DH, iw = ow * SW - PW + kw * DW;
    T v = (T)0;
    if (ih >= 0 && ih < H && iw >= 0 && iw < W)
        v = x[x_off + ((((long)(n0 + b) * C) + (long)g * Cg + c) * H + ih) * W + iw];
    cols[(((long)bg * R) + r) * OH * OW + p] = v;
}

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
    const int R = Cg * KH * KW;
    const __global T *cb = cols + ((long)b * G + g) * R * OH * OW;
    ACC acc = (ACC)0;
    for (int kh = 0; kh < KH; ++kh) {
        const int th = ih + PH - kh * DH;
        if (th < 0 || th % SH) continue;
        const int oh = th / SH;
        if (oh >= OH) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int tw = iw + PW - kw * DW;
            if (tw < 0 || tw % SW) continue;
            const int ow = tw / SW;
            if (ow >= OW) continue;
            acc += (ACC)cb[((long)(cl * KH + kh) * KW + kw) * OH * OW + oh * OW + ow];
        }
    }
    gx[gx_off + ((((long)(n0 + b) * C) + c) * H + ih) * W + iw] = (T)acc;
}
