// 2-D pooling (NCHW), forward and backward: max (with argmax indices), average, adaptive average.
//
// Forward kernels: global (OW, OH, N*C); one work-item computes one output element from its
//   window (reads the window, writes one value; max also writes the flat index ih*W + iw of the
//   maximum inside its (n, c) plane, PyTorch's convention; padding never wins a max).
// Backward kernels are gathers (no atomics): global (W, H, N*C); one work-item sums, for its
//   input element, the output gradients of every window that contains it (for max: whose saved
//   index points at it). Windows are walked through (kh, kw) so each (oh, ow) is met once.
// max_pool2d_backward_plane (CPUs): global (N*C); one work-item owns one (n, c) plane: it zeroes
//   the plane's H*W gradients and adds each of the plane's OH*OW output gradients at its saved
//   index (a scatter inside the plane, so no other work-item can collide: no atomics). O(H*W +
//   OH*OW) per plane, sequential reads and writes that stay in L1, no div/mod; overlapping
//   windows just add twice, in output order.
// Geometry: KH KW kernel, SH SW stride, PH PW padding, DH DW dilation (max only; average uses 1).
// Average divisor: count_include_pad ? window clipped to the padded input : valid elements only.
// Every dtype of common.cl: elements are read with LOAD_T and written with STORE_T, compared and summed
// in ACC (float16/bfloat16 storage: float arithmetic; maxima are exact copies of their inputs).

#include "common.cl"

#ifndef T
#define T float            // storage type
#endif
#ifndef ACC
#define ACC T              // accumulation type
#endif

#define PLANE_ARGS const int NC, const int H, const int W, const int OH, const int OW
#define WIN_ARGS const int KH, const int KW, const int SH, const int SW, const int PH, const int PW, \
                 const int DH, const int DW

__kernel void max_pool2d(__global const T *x, const long x_off, __global T *y, __global long *idx,
                         PLANE_ARGS, WIN_ARGS)
{
    const int ow = get_global_id(0), oh = get_global_id(1), z = get_global_id(2);
    if (ow >= OW || oh >= OH || z >= NC) return;
    const __global T *xp = x + x_off + (long)z * H * W;
    ACC best = 0;
    long best_i = -1;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = oh * SH - PH + kh * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = ow * SW - PW + kw * DW;
            if (iw < 0 || iw >= W) continue;
            const ACC v = LOAD_T(xp, (long)ih * W + iw);
            if (best_i < 0 || v > best || (isnan(v) && !isnan(best))) {  // NaN wins, as in PyTorch
                best = v;
                best_i = (long)ih * W + iw;
            }
        }
    }
    const long o = ((long)z * OH + oh) * OW + ow;
    STORE_T(y, o, best);
    idx[o] = best_i;
}

// max_pool2d_rows (CPUs): global (OH, N*C); one work-item computes one output row (z, oh): for each
//   kernel row kh it walks the input row left to right with an incrementing column (no div/mod),
//   keeping the row's running maxima in y/idx (written once per kh pass, read back from L1).
//   Same results and NaN rule as max_pool2d (first maximum in (kh, kw) order wins ties).
__kernel void max_pool2d_rows(__global const T *x, const long x_off, __global T *y, __global long *idx,
                              PLANE_ARGS, WIN_ARGS)
{
    const int oh = get_global_id(0), z = get_global_id(1);
    if (oh >= OH || z >= NC) return;
    const __global T *xp = x + x_off + (long)z * H * W;
    const long o0 = ((long)z * OH + oh) * OW;
    __global T *yr = y + o0;
    __global long *ir = idx + o0;
    for (int ow = 0; ow < OW; ++ow) ir[ow] = -1;
    const int ih0 = oh * SH - PH;
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * DH;
        if (ih < 0 || ih >= H) continue;
        const __global T *xr = xp + (long)ih * W;
        const long rbase = (long)ih * W;
        int iw0 = -PW;
        for (int ow = 0; ow < OW; ++ow, iw0 += SW) {
            ACC best = LOAD_T(yr, ow);
            long best_i = ir[ow];
            int iw = iw0;
            for (int kw = 0; kw < KW; ++kw, iw += DW) {
                if (iw < 0 || iw >= W) continue;
                const ACC v = LOAD_T(xr, iw);
                if (best_i < 0 || v > best || (isnan(v) && !isnan(best))) {
                    best = v;
                    best_i = rbase + iw;
                }
            }
            STORE_T(yr, ow, best);
            ir[ow] = best_i;
        }
    }
    for (int ow = 0; ow < OW; ++ow) if (ir[ow] < 0) STORE_T(yr, ow, (ACC)0);
}

// max_pool2d_2x2 (CPUs, kernel 2 stride 2, no padding, dilation 1: the usual CNN pool): global
//   (OH, N*C); one work-item computes one output row from two input rows with vload2 loads (no
//   bounds checks inside the row: 2*OW <= W). Same tie/NaN rule as max_pool2d.
inline void mp_take(const ACC v, const long i, ACC *best, long *bi)
{
    if (v > *best || (isnan(v) && !isnan(*best))) { *best = v; *bi = i; }
}

__kernel void max_pool2d_2x2(__global const T *x, const long x_off, __global T *y, __global long *idx,
                             PLANE_ARGS)
{
    const int oh = get_global_id(0), z = get_global_id(1);
    if (oh >= OH || z >= NC) return;
    const long r0 = (long)(2 * oh) * W;
    const __global T *x0 = x + x_off + (long)z * H * W + r0;
    const __global T *x1 = x0 + W;
    const long o0 = ((long)z * OH + oh) * OW;
    for (int ow = 0; ow < OW; ++ow) {
        const int iw = 2 * ow;
        const ACC a0 = LOAD_T(x0, iw), a1 = LOAD_T(x0, iw + 1), b0 = LOAD_T(x1, iw), b1 = LOAD_T(x1, iw + 1);
        ACC best = a0;
        long bi = r0 + iw;
        mp_take(a1, r0 + iw + 1, &best, &bi);
        mp_take(b0, r0 + W + iw, &best, &bi);
        mp_take(b1, r0 + W + iw + 1, &best, &bi);
        STORE_T(y, o0 + ow, best);
        idx[o0 + ow] = bi;
    }
}

__kernel void max_pool2d_backward(__global const T *gy, const long gy_off, __global const long *idx,
                                  __global T *gx, PLANE_ARGS, WIN_ARGS)
{
    const int iw = get_global_id(0), ih = get_global_id(1), z = get_global_id(2);
    if (iw >= W || ih >= H || z >= NC) return;
    const long self = (long)ih * W + iw;
    const long base = (long)z * OH * OW;
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
            const long o = base + (long)oh * OW + ow;
            if (idx[o] == self) acc += LOAD_T(gy, gy_off + o);
        }
    }
    STORE_T(gx, (long)z * H * W + self, acc);
}

__kernel void max_pool2d_backward_plane(__global const T *gy, const long gy_off, __global const long *idx,
                                        __global T *gx, const int NC, const int HW, const int OHW)
{
    const int z = get_global_id(0);
    if (z >= NC) return;
    __global T *gp = gx + (long)z * HW;
    const __global T *g = gy + gy_off + (long)z * OHW;
    const __global long *ip = idx + (long)z * OHW;
    for (int i = 0; i < HW; ++i) STORE_T(gp, i, (ACC)0);
    for (int o = 0; o < OHW; ++o) {
        const long i = ip[o];
        if (i >= 0 && i < HW) STORE_T(gp, i, LOAD_T(gp, i) + LOAD_T(g, o));
    }
}

inline int avg_divisor(const int oh, const int ow, const int H, const int W, const int KH, const int KW,
                       const int SH, const int SW, const int PH, const int PW, const int include_pad)
{
    const int hs = oh * SH - PH, ws = ow * SW - PW;
    int he = min(hs + KH, H + PH), we = min(ws + KW, W + PW);
    if (include_pad) return (he - hs) * (we - ws);
    return (min(he, H) - max(hs, 0)) * (min(we, W) - max(ws, 0));
}

__kernel void avg_pool2d(__global const T *x, const long x_off, __global T *y, PLANE_ARGS, WIN_ARGS,
                         const int include_pad)
{
    const int ow = get_global_id(0), oh = get_global_id(1), z = get_global_id(2);
    if (ow >= OW || oh >= OH || z >= NC) return;
    const __global T *xp = x + x_off + (long)z * H * W;
    ACC acc = (ACC)0;
    const int hs = oh * SH - PH, ws = ow * SW - PW;
    for (int ih = max(hs, 0); ih < min(hs + KH, H); ++ih)
        for (int iw = max(ws, 0); iw < min(ws + KW, W); ++iw) acc += LOAD_T(xp, (long)ih * W + iw);
    const int div = avg_divisor(oh, ow, H, W, KH, KW, SH, SW, PH, PW, include_pad);
    STORE_T(y, ((long)z * OH + oh) * OW + ow, acc / (ACC)max(div, 1));
}

__kernel void avg_pool2d_backward(__global const T *gy, const long gy_off, __global T *gx, PLANE_ARGS, WIN_ARGS,
                                  const int include_pad)
{
    const int iw = get_global_id(0), ih = get_global_id(1), z = get_global_id(2);
    if (iw >= W || ih >= H || z >= NC) return;
    const __global T *gp = gy + gy_off + (long)z * OH * OW;
    ACC acc = (ACC)0;
    for (int kh = 0; kh < KH; ++kh) {
        const int th = ih + PH - kh;
        if (th < 0 || th % SH) continue;
        const int oh = th / SH;
        if (oh >= OH) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int tw = iw + PW - kw;
            if (tw < 0 || tw % SW) continue;
            const int ow = tw / SW;
            if (ow >= OW) continue;
            const int div = avg_divisor(oh, ow, H, W, KH, KW, SH, SW, PH, PW, include_pad);
            acc += LOAD_T(gp, oh * OW + ow) / (ACC)max(div, 1);
        }
    }
    STORE_T(gx, ((long)z * H + ih) * W + iw, acc);
}

// Adaptive average: output cell (oh, ow) averages rows [floor(oh*H/OH), ceil((oh+1)*H/OH)) and
// the matching columns (PyTorch's windows). Global average pooling is OH = OW = 1.
__kernel void adaptive_avg_pool2d(__global const T *x, const long x_off, __global T *y, PLANE_ARGS)
{
    const int ow = get_global_id(0), oh = get_global_id(1), z = get_global_id(2);
    if (ow >= OW || oh >= OH || z >= NC) return;
    const int hs = (oh * H) / OH, he = ((oh + 1) * H + OH - 1) / OH;
    const int ws = (ow * W) / OW, we = ((ow + 1) * W + OW - 1) / OW;
    const __global T *xp = x + x_off + (long)z * H * W;
    ACC acc = (ACC)0;
    for (int ih = hs; ih < he; ++ih)
        for (int iw = ws; iw < we; ++iw) acc += LOAD_T(xp, (long)ih * W + iw);
    STORE_T(y, ((long)z * OH + oh) * OW + ow, acc / (ACC)((he - hs) * (we - ws)));
}

__kernel void adaptive_avg_pool2d_backward(__global const T *gy, const long gy_off, __global T *gx, PLANE_ARGS)
{
    const int iw = get_global_id(0), ih = get_global_id(1), z = get_global_id(2);
    if (iw >= W || ih >= H || z >= NC) return;
    const __global T *gp = gy + gy_off + (long)z * OH * OW;
    ACC acc = (ACC)0;
    // candidate output rows: those whose window [hs, he) contains ih
    for (int oh = (ih * OH) / H; oh < OH; ++oh) {
        const int hs = (oh * H) / OH, he = ((oh + 1) * H + OH - 1) / OH;
        if (hs > ih) break;
        if (ih >= he) continue;
        for (int ow = (iw * OW) / W; ow < OW; ++ow) {
            const int ws = (ow * W) / OW, we = ((ow + 1) * W + OW - 1) / OW;
            if (ws > iw) break;
            if (iw >= we) continue;
            acc += LOAD_T(gp, oh * OW + ow) / (ACC)((he - hs) * (we - ws));
        }
    }
    STORE_T(gx, ((long)z * H + ih) * W + iw, acc);
}
