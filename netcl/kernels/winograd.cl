// Winograd F(2x2, 3x3) convolution as three transforms around one batched GEMM (NCHW, stride 1,
// dilation 1, groups 1, any padding). With e = 0..15 the 16 positions of a 4x4 transformed tile:
//
// winograd_filter_2x2_3x3: U[e, k, c] = (G g[k,c] G^T)[e], G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],
//   [0,0,1]], stored at u[e*SE + k*SK + c*SC] (the host passes (K*C, C, 1): U is 16 row-major K x C
//   matrices). Global (K*C), one work-item per filter.
// winograd_input_2x2_3x3: V[e, c, n*TT + t] = (B^T d B)[e] for the 4x4 input tile d of output tile t
//   (TT = TH*TW tiles of 2x2 outputs per image, zero outside the image) of images n0..n0+NB-1.
//   V is 16 row-major C x PT matrices (PT = NB*TT). Global (TT, C, NB): one work-item per tile and
//   channel; consecutive work-items write consecutive tiles (coalesced).
// Then M[e] = U[e] @ V[e] (16 GEMMs of K x C x PT: one batched GEMM launch, host side).
// winograd_output_2x2_3x3: y[n0+n, k, 2*th + i, 2*tw + j] = act((A^T m A)[i, j] + bias[k]) with
//   m[e] = M[e, k, n*TT + t], A^T = [[1,1,1,0],[0,1,-1,-1]]; partial tiles at the right and bottom
//   edges write only their inside outputs. Global (TT, K, NB).
// The GEMM does 16 multiply-adds per 2x2 outputs and channel instead of 36 (2.25x fewer).
// Error: the transforms use only +-1 and 1/2, so each output carries a few more roundings than
// direct convolution; tests/ops/test_conv.py measures it and bounds it.

#include "common.cl"

#ifndef T
#define T float            // storage type (float or double)
#endif

#define CAT(a, b) a##b
#define VEC(t, n) CAT(t, n)
#define T4 VEC(T, 4)

// ACT (common.cl): ACT_NONE or ACT_RELU
#if ACT == ACT_RELU
#define APPLY_ACT(v) fmax((v), (T)0)
#else
#define APPLY_ACT(v) (v)
#endif

__kernel void winograd_filter_2x2_3x3(__global const T *w, const long w_off, __global T *u,
                                      const int K, const int C, const long SE, const long SK, const long SC)
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
    __global T *out = u + k * SK + c * SC;
    for (int r = 0; r < 4; ++r) {
        const T a = gg[r][0], b = gg[r][1], d = gg[r][2];
        out[(r * 4 + 0) * SE] = a;
        out[(r * 4 + 1) * SE] = (T)0.5 * (a + b + d);
        out[(r * 4 + 2) * SE] = (T)0.5 * (a - b + d);
        out[(r * 4 + 3) * SE] = d;
    }
}

inline T4 load_row4(const __global T *xc, const int ih, const int iw0, const int H, const int W)
{
    T4 r = (T4)(0);
    if (ih < 0 || ih >= H) return r;
    const __global T *p = xc + (long)ih * W;
    r.x = (iw0 >= 0 && iw0 < W) ? p[iw0] : (T)0;
    r.y = (iw0 + 1 >= 0 && iw0 + 1 < W) ? p[iw0 + 1] : (T)0;
    r.z = (iw0 + 2 >= 0 && iw0 + 2 < W) ? p[iw0 + 2] : (T)0;
    r.w = (iw0 + 3 >= 0 && iw0 + 3 < W) ? p[iw0 + 3] : (T)0;
    return r;
}

__kernel void winograd_input_2x2_3x3(__global const T *x, const long x_off, __global T *v,
                                     const int n0, const int NB, const int C, const int H, const int W,
                                     const int TW, const int TT, const int PH, const int PW)
{
    const int t = get_global_id(0), c = get_global_id(1), n = get_global_id(2);
    if (t >= TT || c >= C || n >= NB) return;
    const int th = t / TW, tw = t - (t / TW) * TW;
    const int ih0 = th * 2 - PH, iw0 = tw * 2 - PW;
    const __global T *xc = x + x_off + ((long)(n0 + n) * C + c) * H * W;
    const T4 d0 = load_row4(xc, ih0, iw0, H, W);
    const T4 d1 = load_row4(xc, ih0 + 1, iw0, H, W);
    const T4 d2 = load_row4(xc, ih0 + 2, iw0, H, W);
    const T4 d3 = load_row4(xc, ih0 + 3, iw0, H, W);
    // B^T d (rows), then (B^T d) B (columns of each row)
    const T4 r[4] = {d0 - d2, d1 + d2, d2 - d1, d1 - d3};
    const long PT = (long)NB * TT, SE = (long)C * PT;
    __global T *out = v + (long)c * PT + (long)n * TT + t;
    for (int i = 0; i < 4; ++i) {
        out[(4 * i + 0) * SE] = r[i].x - r[i].z;
        out[(4 * i + 1) * SE] = r[i].y + r[i].z;
        out[(4 * i + 2) * SE] = r[i].z - r[i].y;
        out[(4 * i + 3) * SE] = r[i].y - r[i].w;
    }
}

__kernel void winograd_output_2x2_3x3(__global const T *m, __global const T *bias, const long b_off,
                                      const int has_bias, __global T *y, const long y_off,
                                      const int n0, const int NB, const int K, const int OH, const int OW,
                                      const int TW, const int TT)
{
    const int t = get_global_id(0), k = get_global_id(1), n = get_global_id(2);
    if (t >= TT || k >= K || n >= NB) return;
    const long PT = (long)NB * TT, SE = (long)K * PT;
    const __global T *in = m + (long)k * PT + (long)n * TT + t;
    T4 row[4];
    for (int i = 0; i < 4; ++i)
        row[i] = (T4)(in[(4 * i) * SE], in[(4 * i + 1) * SE], in[(4 * i + 2) * SE], in[(4 * i + 3) * SE]);
    // A^T m: two rows; then each times A: two columns
    const T4 a0 = row[0] + row[1] + row[2], a1 = row[1] - row[2] - row[3];
    const T b = has_bias ? bias[b_off + k] : (T)0;
    const T y00 = a0.x + a0.y + a0.z + b, y01 = a0.y - a0.z - a0.w + b;
    const T y10 = a1.x + a1.y + a1.z + b, y11 = a1.y - a1.z - a1.w + b;
    const int th = t / TW, tw = t - (t / TW) * TW;
    const int oh0 = th * 2, ow0 = tw * 2;
    __global T *yk = y + y_off + ((long)(n0 + n) * K + k) * OH * OW;
    const bool right = ow0 + 1 < OW;
    yk[(long)oh0 * OW + ow0] = APPLY_ACT(y00);
    if (right) yk[(long)oh0 * OW + ow0 + 1] = APPLY_ACT(y01);
    if (oh0 + 1 < OH) {
        yk[(long)(oh0 + 1) * OW + ow0] = APPLY_ACT(y10);
        if (right) yk[(long)(oh0 + 1) * OW + ow0 + 1] = APPLY_ACT(y11);
    }
}
