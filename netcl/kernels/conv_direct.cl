// Direct 2-D convolution (NCHW), forward and both backward passes, for any stride, padding,
// dilation and group count (depthwise is groups == C, built with KB=1 and a wide OWB).
//
// conv2d_direct: y[n,k,oh,ow] = act(bias[k] + sum_{c,kh,kw} x[n, g*Cg+c, ih, iw] * w[k,c,kh,kw])
//   with ih = oh*SH - PH + kh*DH, iw = ow*SW - PW + kw*DW, g = k / Kg (zero outside the image).
//   Layout: global (ceil(OW/OWB), OH, N * G * ceil(Kg/KB)). One work-item computes a register
//   block of KB output channels (of one group) x OWB neighbouring output columns of one row:
//   no barriers, no local memory (the shape PoCL's CPU vectoriser likes; GPUs use im2col+GEMM).
//   Reads x (each input row OWB/SW times less than a per-output kernel would), w; writes y once.
// conv2d_backward_input: gx[n,c,ih,iw] = sum over (k in c's group, kh, kw) with a valid output
//   position of gy[n,k,oh,ow] * w[k,c%Cg,kh,kw]. A gather (no atomics); also conv_transpose2d,
//   which adds bias[c] and the activation. Layout: global (W, H, N*C), one work-item per element.
// conv2d_backward_weight: gw[k,c,kh,kw] = sum_{n,oh,ow} gy[n,k,oh,ow] * x[n,g*Cg+c,ih,iw].
//   Layout: global (Cg*KH*KW, K), one work-item per weight element.
// conv2d_backward_bias: gb[k] = sum_{n,oh,ow} gy[n,k,oh,ow]; global (K * BWG), local (BWG): one work-group
//   per k, strided partial sums then a tree reduction.
//
// All tensors are contiguous NCHW / (K, Cg, KH, KW), with element offsets. Accumulation in ACC; elements
// read with LOAD_T and written with STORE_T (common.cl), so float16 and bfloat16 storage compute in float.

#include "common.cl"

#ifndef T
#define T float            // storage type
#endif
#ifndef ACC
#define ACC T              // accumulation type
#endif
#ifndef KB
#define KB 4               // output channels per work-item (register block rows)
#endif
#ifndef OWB
#define OWB 4              // output columns per work-item (register block columns)
#endif
// ACT (common.cl): ACT_NONE or ACT_RELU, fused into the output stage
#if ACT == ACT_RELU
#define APPLY_ACT(v) fmax((v), (ACC)0)
#else
#define APPLY_ACT(v) (v)
#endif

__kernel void conv2d_direct(__global const T *x, const long x_off, __global const T *w, const long w_off,
                            __global const T *bias, const long b_off, const int has_bias,
                            __global T *y, const long y_off,
                            const int N, const int C, const int H, const int W,
                            const int K, const int OH, const int OW, const int KH, const int KW,
                            const int SH, const int SW, const int PH, const int PW,
                            const int DH, const int DW, const int G)
{
    const int owb = get_global_id(0);
    const int oh = get_global_id(1);
    const int z = get_global_id(2);
    const int Cg = C / G, Kg = K / G;
    const int kblocks_per_group = (Kg + KB - 1) / KB;
    const int kblocks = G * kblocks_per_group;
    if (owb * OWB >= OW || oh >= OH || z >= N * kblocks) return;
    const int n = z / kblocks;
    const int kbi = z - n * kblocks;
    const int g = kbi / kblocks_per_group;
    const int k0 = g * Kg + (kbi - g * kblocks_per_group) * KB;
    const int kvalid = min(KB, g * Kg + Kg - k0);
    const int ow0 = owb * OWB;

    ACC acc[KB][OWB];
    for (int kk = 0; kk < KB; ++kk)
        for (int j = 0; j < OWB; ++j) acc[kk][j] = (ACC)0;

    const __global T *xg = x + x_off + ((long)n * C + (long)g * Cg) * H * W;
    const __global T *wk = w + w_off + (long)k0 * Cg * KH * KW;
    const int wstride_k = Cg * KH * KW;
    for (int c = 0; c < Cg; ++c) {
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = oh * SH - PH + kh * DH;
            if (ih < 0 || ih >= H) continue;
            const __global T *row = xg + ((long)c * H + ih) * W;
            for (int kw = 0; kw < KW; ++kw) {
                ACC xv[OWB];
                for (int j = 0; j < OWB; ++j) {
                    const int iw = (ow0 + j) * SW - PW + kw * DW;
                    xv[j] = (iw >= 0 && iw < W) ? LOAD_T(row, iw) : (ACC)0;
                }
                const int widx = (c * KH + kh) * KW + kw;
                for (int kk = 0; kk < KB; ++kk) {
                    const ACC wv = LOAD_T(wk, min(kk, kvalid - 1) * wstride_k + widx);
                    for (int j = 0; j < OWB; ++j) acc[kk][j] = fma(wv, xv[j], acc[kk][j]);
                }
            }
        }
    }
    for (int kk = 0; kk < KB; ++kk) {
        if (kk >= kvalid) break;
        const int k = k0 + kk;
        const ACC b = has_bias ? LOAD_T(bias, b_off + k) : (ACC)0;
        __global T *yrow = y + y_off + (((long)n * K + k) * OH + oh) * OW;
        for (int j = 0; j < OWB; ++j)
            if (ow0 + j < OW) STORE_T(yrow, ow0 + j, APPLY_ACT(acc[kk][j] + b));
    }
}

__kernel void conv2d_backward_input(__global const T *gy, const long gy_off, __global const T *w,
                                    const long w_off, __global const T *bias, const long b_off,
                                    const int has_bias, __global T *gx, const long gx_off,
                                    const int N, const int C, const int H, const int W,
                                    const int K, const int OH, const int OW, const int KH, const int KW,
                                    const int SH, const int SW, const int PH, const int PW,
                                    const int DH, const int DW, const int G)
{
    const int iw = get_global_id(0);
    const int ih = get_global_id(1);
    const int z = get_global_id(2);
    if (iw >= W || ih >= H || z >= N * C) return;
    const int n = z / C, c = z - (z / C) * C;
    const int Cg = C / G, Kg = K / G;
    const int g = c / Cg, cl = c - g * Cg;
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
            const __global T *gyp = gy + gy_off + (((long)n * K + (long)g * Kg) * OH + oh) * OW + ow;
            const __global T *wp = w + w_off + (((long)g * Kg * Cg + cl) * KH + kh) * KW + kw;
            for (int k = 0; k < Kg; ++k)
                acc = fma(LOAD_T(gyp, (long)k * OH * OW), LOAD_T(wp, (long)k * Cg * KH * KW), acc);
        }
    }
    if (has_bias) acc += LOAD_T(bias, b_off + c);
    STORE_T(gx, gx_off + (((long)n * C + c) * H + ih) * W + iw, APPLY_ACT(acc));
}

__kernel void conv2d_backward_weight(__global const T *x, const long x_off, __global const T *gy,
                                     const long gy_off, __global T *gw, const long gw_off,
                                     const int N, const int C, const int H, const int W,
                                     const int K, const int OH, const int OW, const int KH, const int KW,
                                     const int SH, const int SW, const int PH, const int PW,
                                     const int DH, const int DW, const int G)
{
    const int i = get_global_id(0);
    const int k = get_global_id(1);
    const int Cg = C / G, Kg = K / G;
    if (i >= Cg * KH * KW || k >= K) return;
    const int c = i / (KH * KW);
    const int kh = (i / KW) % KH;
    const int kw = i % KW;
    const int g = k / Kg;
    ACC acc = (ACC)0;
    for (int n = 0; n < N; ++n) {
        const __global T *xc = x + x_off + ((long)n * C + (long)g * Cg + c) * H * W;
        const __global T *gyk = gy + gy_off + ((long)n * K + k) * OH * OW;
        for (int oh = 0; oh < OH; ++oh) {
            const int ih = oh * SH - PH + kh * DH;
            if (ih < 0 || ih >= H) continue;
            for (int ow = 0; ow < OW; ++ow) {
                const int iw = ow * SW - PW + kw * DW;
                if (iw >= 0 && iw < W) acc = fma(LOAD_T(gyk, oh * OW + ow), LOAD_T(xc, (long)ih * W + iw), acc);
            }
        }
    }
    STORE_T(gw, gw_off + (long)k * Cg * KH * KW + i, acc);
}

#ifndef BWG
#define BWG 256            // conv2d_backward_bias: work-items per output channel (a power of two)
#endif

__kernel __attribute__((reqd_work_group_size(BWG, 1, 1)))
void conv2d_backward_bias(__global const T *gy, const long gy_off, __global T *gb, const long gb_off,
                          const int N, const int K, const int HW)
{
    // work-group k sums plane k of every image: work-item l takes elements l, l + BWG, ... of each
    // plane (coalesced), then a tree reduction in local memory (fixed order: deterministic)
    __local ACC part[BWG];
    const int k = get_group_id(0), l = get_local_id(0);
    ACC acc = (ACC)0;
    for (int n = 0; n < N; ++n) {
        const __global T *p = gy + gy_off + ((long)n * K + k) * HW;
        for (int i = l; i < HW; i += BWG) acc += LOAD_T(p, i);
    }
    part[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BWG / 2; s > 0; s >>= 1) {
        if (l < s) part[l] += part[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) STORE_T(gb, gb_off + k, part[0]);
}
