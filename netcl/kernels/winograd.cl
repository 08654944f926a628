// Winograd F(2x2, 3x3) convolution (NCHW, stride 1, dilation 1, groups 1, any padding).
//
// winograd_filter_2x2_3x3: U[c, k, :] = G g[k,c] G^T (4x4, flattened row-major into 16 values),
//   G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],[0,0,1]]. Global (K*C), one work-item per filter.
//   U is laid out (C, KPAD, 16) with KPAD = K rounded up to KB; the padding rows must be zero.
// winograd_2x2_3x3: for each 2x2 output tile, V = B^T d B of the 4x4 input tile d (per channel),
//   M[k] += U[c,k] .* V (16 products for 4 outputs instead of 36), Y = A^T M A, then bias and
//   activation in the output stage. Layout: global (ceil(OW/2), ceil(OH/2), N * KPAD/KB); one
//   work-item owns a tile for KB output channels: KB vector16 accumulators, no barriers.
//   Reads x (4x4 tile per channel) and U (KB*16 per channel); writes y once.
// Error: the transforms use only +-1 and 1/2, so each output carries a few more roundings than
// direct convolution; tests/ops/test_conv.py measures it and bounds it.

#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#ifndef T
#define T float            // storage type (float or double)
#endif
#ifndef KB
#define KB 4               // output channels per work-item
#endif
#ifndef ACTIVATION
#define ACTIVATION 0       // 0: none, 1: relu
#endif

#define CAT(a, b) a##b
#define VEC(t, n) CAT(t, n)
#define T4 VEC(T, 4)
#define T16 VEC(T, 16)
#define VLOAD4 vload4
#define VLOAD16 vload16

#if ACTIVATION == 1
#define ACT(v) fmax((v), (T)0)
#else
#define ACT(v) (v)
#endif

__kernel void winograd_filter_2x2_3x3(__global const T *w, const long w_off, __global T *u,
                                      const int K, const int C, const int KPAD)
{
    const int i = get_global_id(0);
    if (i >= K * C) return;
    const int k = i / C, c = i - (i / C) * C;
    const __global T *g = w + w_off + (long)i * 9;
    T gg[4][3];
    for (int j = 0; j < 3; ++j) {
        const T a = g[j], b = g[3 + j], d = g[6 + j];
        gg[0][j] = a;
        gg[1][j] = (T)0.5 * (a + b + d);
        gg[2][j] = (T)0.5 * (a - b + d);
        gg[3][j] = d;
    }
    __global T *out = u + ((long)c * KPAD + k) * 16;
    for (int r = 0; r < 4; ++r) {
        const T a = gg[r][0], b = gg[r][1], d = gg[r][2];
        out[r * 4 + 0] = a;
        out[r * 4 + 1] = (T)0.5 * (a + b + d);
        out[r * 4 + 2] = (T)0.5 * (a - b + d);
        out[r * 4 + 3] = d;
    }
}

inline T4 load_row4(const __global T *xc, const int ih, const int iw0, const int H, const int W)
{
    T4 r = (T4)(0);
    if (ih < 0 || ih >= H) return r;
    const __global T *p = xc + (long)ih * W;
    if (iw0 >= 0 && iw0 + 3 < W) return VLOAD4(0, p + iw0);
    r.x = (iw0 >= 0 && iw0 < W) ? p[iw0] : (T)0;
    r.y = (iw0 + 1 >= 0 && iw0 + 1 < W) ? p[iw0 + 1] : (T)0;
    r.z = (iw0 + 2 >= 0 && iw0 + 2 < W) ? p[iw0 + 2] : (T)0;
    r.w = (iw0 + 3 >= 0 && iw0 + 3 < W) ? p[iw0 + 3] : (T)0;
    return r;
}

__kernel void winograd_2x2_3x3(__global const T *x, const long x_off, __global const T *u,
                               __global const T *bias, const long b_off, const int has_bias,
                               __global T *y, const long y_off,
                               const int N, const int C, const int H, const int W, const int K,
                               const int KPAD, const int OH, const int OW, const int PH, const int PW)
{
    const int tw = get_global_id(0);
    const int th = get_global_id(1);
    const int z = get_global_id(2);
    const int kblocks = KPAD / KB;
    if (tw * 2 >= OW || th * 2 >= OH || z >= N * kblocks) return;
    const int n = z / kblocks;
    const int k0 = (z - n * kblocks) * KB;
    const int ih0 = th * 2 - PH, iw0 = tw * 2 - PW;

    T16 acc[KB];
    for (int kk = 0; kk < KB; ++kk) acc[kk] = (T16)(0);

    const __global T *xn = x + x_off + (long)n * C * H * W;
    for (int c = 0; c < C; ++c) {
        const __global T *xc = xn + (long)c * H * W;
        const T4 d0 = load_row4(xc, ih0, iw0, H, W);
        const T4 d1 = load_row4(xc, ih0 + 1, iw0, H, W);
        const T4 d2 = load_row4(xc, ih0 + 2, iw0, H, W);
        const T4 d3 = load_row4(xc, ih0 + 3, iw0, H, W);
        // B^T d: rows
        const T4 t0 = d0 - d2, t1 = d1 + d2, t2 = d2 - d1, t3 = d1 - d3;
        // (B^T d) B: columns, per row
        T16 v;
        v.s0123 = (T4)(t0.x - t0.z, t0.y + t0.z, t0.z - t0.y, t0.y - t0.w);
        v.s4567 = (T4)(t1.x - t1.z, t1.y + t1.z, t1.z - t1.y, t1.y - t1.w);
        v.s89ab = (T4)(t2.x - t2.z, t2.y + t2.z, t2.z - t2.y, t2.y - t2.w);
        v.scdef = (T4)(t3.x - t3.z, t3.y + t3.z, t3.z - t3.y, t3.y - t3.w);
        const __global T *uc = u + ((long)c * KPAD + k0) * 16;
        for (int kk = 0; kk < KB; ++kk) acc[kk] = fma(VLOAD16(kk, uc), v, acc[kk]);
    }

    const int oh0 = th * 2, ow0 = tw * 2;
    for (int kk = 0; kk < KB; ++kk) {
        const int k = k0 + kk;
        if (k >= K) break;
        const T16 m = acc[kk];
        // A^T M: two rows
        const T4 r0 = m.s0123 + m.s4567 + m.s89ab;
        const T4 r1 = m.s4567 - m.s89ab - m.scdef;
        const T b = has_bias ? bias[b_off + k] : (T)0;
        const T y00 = r0.x + r0.y + r0.z + b, y01 = r0.y - r0.z - r0.w + b;
        const T y10 = r1.x + r1.y + r1.z + b, y11 = r1.y - r1.z - r1.w + b;
        __global T *yk = y + y_off + ((long)n * K + k) * OH * OW;
        const bool right = ow0 + 1 < OW;
        yk[(long)oh0 * OW + ow0] = ACT(y00);
        if (right) yk[(long)oh0 * OW + ow0 + 1] = ACT(y01);
        if (oh0 + 1 < OH) {
            yk[(long)(oh0 + 1) * OW + ow0] = ACT(y10);
            if (right) yk[(long)(oh0 + 1) * OW + ow0 + 1] = ACT(y11);
        }
    }
}
