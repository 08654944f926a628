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
//
// Weight gradient (same tiles, same V): with Z[e, k, n*TT + t] = (A dY A^T)[e] for the 2x2 block
// of output gradients of tile t (zero outside OH x OW), A = [[1,0],[1,1],[1,-1],[0,-1]],
// dU[e] = Z[e] (K x PT) @ V[e]^T (PT x C) (one batched GEMM, host side) and
// dW[k, c] = G^T dU[:, k, c] G: the adjoint of the forward's U -> M -> y chain.
// winograd_grad_output_2x2_3x3: Z from grad_y; global (TT, K, NB) like the input transform.
// winograd_grad_filter_2x2_3x3: dW from dU stored as S partial sums (S, 16, K, C) (a split GEMM's
//   slices; S = 1 when unsplit), summed here; global (K*C), one work-item per filter.
//
// FLAT (GPUs; the host sets it with a work-group size): the input, output and grad-output transforms
// take a 1-D launch of whole work-groups over TT x C (or K) x NB work-items (padded; t fastest) instead of
// the (TT, C, NB) grid whose work-group the driver picks (with TT = 4 tiles at 4x4 it can pick 4).
//
// CPU variants (`_rows`, work-group size 1 on PoCL): one work-item per tile row (n, c, th), or per
// output channel for the filter transforms, walking the row's tiles with unit-stride reads and
// writes; interior tiles take a branch-free path. PoCL pays per work-item and vectorises inner loops
// without bound checks (bench/NOTES.md, convolution).

#include "common.cl"

#ifndef T
#define T float            // storage type (float or double)
#endif
// TS: the storage type of every global buffer. float16/bfloat16 storage: T becomes float (the transforms'
// arithmetic) and every buffer element goes through common.cl's LOAD_T/STORE_T (read as float, written
// rounded to nearest even); float32/float64: TS is T and LOAD_T/STORE_T are plain reads and writes.
#if defined(IS_HALF)
#define TS half
#undef T
#define T float
#elif defined(IS_BF16)
#define TS ushort
#undef T
#define T float
#else
#define TS T
#endif

#define CAT(a, b) a##b
#define VEC(t, n) CAT(t, n)
#define T4 VEC(T, 4)
#define T2 VEC(T, 2)
#ifndef ACC
#define ACC T
#endif

// ACT (common.cl): ACT_NONE or ACT_RELU
#if ACT == ACT_RELU
#define APPLY_ACT(v) fmax((v), (T)0)
#else
#define APPLY_ACT(v) (v)
#endif

#ifdef FLAT
#define TILE_IDS(t, c, n, C_)                                                                        \
    const long gid_ = get_global_id(0);                                                              \
    const int t = (int)(gid_ % TT), c = (int)((gid_ / TT) % (C_)), n = (int)(gid_ / TT / (C_))
#else
#define TILE_IDS(t, c, n, C_) const int t = get_global_id(0), c = get_global_id(1), n = get_global_id(2)
#endif

// flip = 1: the filter rotated by 180 degrees (g[8 - t]): the backward-data convolution's weight.
#define FILTER_TAP(g, t) LOAD_T((g), flip ? 8 - (t) : (t))

// U of filter i (0 .. K*C-1) into u (see winograd_filter_2x2_3x3)
inline void filter_one(const int i, __global const TS *w, const long w_off, __global TS *u, const int K,
                       const int C, const long SE, const long SK, const long SC, const int flip)
{
    // consecutive work-items take consecutive output columns: c for U[e, k, c], k for the flipped U[e, c, k]
    // (SK = 1), so the 16 stores coalesce either way
    const int k = flip ? i % K : i / C, c = flip ? i / K : i % C;
    const __global TS *g = w + w_off + ((long)k * C + c) * 9;
    T gg[4][3];
    for (int j = 0; j < 3; ++j) {
        const T a = FILTER_TAP(g, j), b = FILTER_TAP(g, 3 + j), d = FILTER_TAP(g, 6 + j);
        gg[0][j] = a;
        gg[1][j] = (T)0.5 * (a + b + d);
        gg[2][j] = (T)0.5 * (a - b + d);
        gg[3][j] = d;
    }
    __global TS *out = u + k * SK + c * SC;
    for (int r = 0; r < 4; ++r) {
        const T a = gg[r][0], b = gg[r][1], d = gg[r][2];
        STORE_T(out, (r * 4 + 0) * SE, a);
        STORE_T(out, (r * 4 + 1) * SE, (T)0.5 * (a + b + d));
        STORE_T(out, (r * 4 + 2) * SE, (T)0.5 * (a - b + d));
        STORE_T(out, (r * 4 + 3) * SE, d);
    }
}

__kernel void winograd_filter_2x2_3x3(__global const TS *w, const long w_off, __global TS *u,
                                      const int K, const int C, const long SE, const long SK, const long SC,
                                      const int flip)
{
    const int i = get_global_id(0);
    if (i >= K * C) return;
    filter_one(i, w, w_off, u, K, C, SE, SK, SC, flip);
}

inline T4 load_row4(const __global TS *xc, const int ih, const int iw0, const int H, const int W)
{
    T4 r = (T4)(0);
    if (ih < 0 || ih >= H) return r;
    const __global TS *p = xc + (long)ih * W;
    r.x = (iw0 >= 0 && iw0 < W) ? LOAD_T(p, iw0) : (T)0;
    r.y = (iw0 + 1 >= 0 && iw0 + 1 < W) ? LOAD_T(p, iw0 + 1) : (T)0;
    r.z = (iw0 + 2 >= 0 && iw0 + 2 < W) ? LOAD_T(p, iw0 + 2) : (T)0;
    r.w = (iw0 + 3 >= 0 && iw0 + 3 < W) ? LOAD_T(p, iw0 + 3) : (T)0;
    return r;
}

// V of tile t, channel c, image n0 + n (see winograd_input_2x2_3x3)
inline void input_one(const int t, const int c, const int n, __global const TS *x, const long x_off,
                      __global TS *v, const int n0, const int NB, const int C, const int H, const int W,
                      const int TW, const int TT, const int PH, const int PW)
{
    const int th = t / TW, tw = t - (t / TW) * TW;
    const int ih0 = th * 2 - PH, iw0 = tw * 2 - PW;
    const __global TS *xc = x + x_off + ((long)(n0 + n) * C + c) * H * W;
    const T4 d0 = load_row4(xc, ih0, iw0, H, W);
    const T4 d1 = load_row4(xc, ih0 + 1, iw0, H, W);
    const T4 d2 = load_row4(xc, ih0 + 2, iw0, H, W);
    const T4 d3 = load_row4(xc, ih0 + 3, iw0, H, W);
    // B^T d (rows), then (B^T d) B (columns of each row)
    const T4 r[4] = {d0 - d2, d1 + d2, d2 - d1, d1 - d3};
    const long PT = (long)NB * TT, SE = (long)C * PT;
    __global TS *out = v + (long)c * PT + (long)n * TT + t;
    for (int i = 0; i < 4; ++i) {
        STORE_T(out, (4 * i + 0) * SE, r[i].x - r[i].z);
        STORE_T(out, (4 * i + 1) * SE, r[i].y + r[i].z);
        STORE_T(out, (4 * i + 2) * SE, r[i].z - r[i].y);
        STORE_T(out, (4 * i + 3) * SE, r[i].y - r[i].w);
    }
}

__kernel void winograd_input_2x2_3x3(__global const TS *x, const long x_off, __global TS *v,
                                     const int n0, const int NB, const int C, const int H, const int W,
                                     const int TW, const int TT, const int PH, const int PW)
{
    TILE_IDS(t, c, n, C);
    if (t >= TT || c >= C || n >= NB) return;
    input_one(t, c, n, x, x_off, v, n0, NB, C, H, W, TW, TT, PH, PW);
}

__kernel void winograd_output_2x2_3x3(__global const TS *m, __global const TS *bias, const long b_off,
                                      const int has_bias, __global TS *y, const long y_off,
                                      const int n0, const int NB, const int K, const int OH, const int OW,
                                      const int TW, const int TT)
{
    TILE_IDS(t, k, n, K);
    if (t >= TT || k >= K || n >= NB) return;
    const long PT = (long)NB * TT, SE = (long)K * PT;
    const __global TS *in = m + (long)k * PT + (long)n * TT + t;
    T4 row[4];
    for (int i = 0; i < 4; ++i)
        row[i] = (T4)(LOAD_T(in, (4 * i) * SE), LOAD_T(in, (4 * i + 1) * SE), LOAD_T(in, (4 * i + 2) * SE),
                      LOAD_T(in, (4 * i + 3) * SE));
    // A^T m: two rows; then each times A: two columns
    const T4 a0 = row[0] + row[1] + row[2], a1 = row[1] - row[2] - row[3];
    const T b = has_bias ? LOAD_T(bias, b_off + k) : (T)0;
    const T y00 = a0.x + a0.y + a0.z + b, y01 = a0.y - a0.z - a0.w + b;
    const T y10 = a1.x + a1.y + a1.z + b, y11 = a1.y - a1.z - a1.w + b;
    const int th = t / TW, tw = t - (t / TW) * TW;
    const int oh0 = th * 2, ow0 = tw * 2;
    __global TS *yk = y + y_off + ((long)(n0 + n) * K + k) * OH * OW;
    const bool right = ow0 + 1 < OW;
    STORE_T(yk, (long)oh0 * OW + ow0, APPLY_ACT(y00));
    if (right) STORE_T(yk, (long)oh0 * OW + ow0 + 1, APPLY_ACT(y01));
    if (oh0 + 1 < OH) {
        STORE_T(yk, (long)(oh0 + 1) * OW + ow0, APPLY_ACT(y10));
        if (right) STORE_T(yk, (long)(oh0 + 1) * OW + ow0 + 1, APPLY_ACT(y11));
    }
}

// -- weight gradient ---------------------------------------------------------------------------------

inline T2 load_pair(const __global TS *gk, const int oh, const int ow0, const int OH, const int OW)
{
    T2 r = (T2)(0);
    if (oh >= OH) return r;
    const __global TS *p = gk + (long)oh * OW;
    r.x = LOAD_T(p, ow0);
    r.y = ow0 + 1 < OW ? LOAD_T(p, ow0 + 1) : (T)0;
    return r;
}

// Z = A dY A^T for the 2x2 block dY = [[a, b], [c, d]]: rows of A dY are (a, b), (a+c, b+d),
// (a-c, b-d), (-c, -d); each row (p, q) times A^T is (p, p+q, p-q, -q).
#define GRAD_OUT_STORE(out, SE, a, b, c, d)                                                  \
    do {                                                                                     \
        const T p1 = (a) + (c), q1 = (b) + (d), p2 = (a) - (c), q2 = (b) - (d);               \
        STORE_T(out, 0 * (SE), (a));       STORE_T(out, 1 * (SE), (a) + (b));                  \
        STORE_T(out, 2 * (SE), (a) - (b)); STORE_T(out, 3 * (SE), -(b));                       \
        STORE_T(out, 4 * (SE), p1);        STORE_T(out, 5 * (SE), p1 + q1);                    \
        STORE_T(out, 6 * (SE), p1 - q1);   STORE_T(out, 7 * (SE), -q1);                        \
        STORE_T(out, 8 * (SE), p2);        STORE_T(out, 9 * (SE), p2 + q2);                    \
        STORE_T(out, 10 * (SE), p2 - q2);  STORE_T(out, 11 * (SE), -q2);                       \
        STORE_T(out, 12 * (SE), -(c));     STORE_T(out, 13 * (SE), -(c) - (d));                \
        STORE_T(out, 14 * (SE), (d) - (c)); STORE_T(out, 15 * (SE), (d));                      \
    } while (0)

// Z of tile t, channel k of grad_y, image n0 + n (see winograd_grad_output_2x2_3x3)
inline void grad_output_one(const int t, const int k, const int n, __global const TS *gy, const long gy_off,
                            __global TS *z, const int n0, const int NB, const int K, const int OH, const int OW,
                            const int TW, const int TT)
{
    const int th = t / TW, tw = t - (t / TW) * TW;
    const __global TS *gk = gy + gy_off + ((long)(n0 + n) * K + k) * OH * OW;
    const T2 r0 = load_pair(gk, 2 * th, 2 * tw, OH, OW), r1 = load_pair(gk, 2 * th + 1, 2 * tw, OH, OW);
    const long PT = (long)NB * TT, SE = (long)K * PT;
    __global TS *out = z + (long)k * PT + (long)n * TT + t;
    GRAD_OUT_STORE(out, SE, r0.x, r0.y, r1.x, r1.y);
}

__kernel void winograd_grad_output_2x2_3x3(__global const TS *gy, const long gy_off, __global TS *z,
                                           const int n0, const int NB, const int K, const int OH,
                                           const int OW, const int TW, const int TT)
{
    TILE_IDS(t, k, n, K);
    if (t >= TT || k >= K || n >= NB) return;
    grad_output_one(t, k, n, gy, gy_off, z, n0, NB, K, OH, OW, TW, TT);
}

// dW[k, c] = G^T D G for D = sum over s of dU[s, :, k, c] (4x4), G^T = [[1, 1/2, 1/2, 0],
// [0, 1/2, -1/2, 0], [0, 1/2, 1/2, 1]].
inline void grad_filter_one(const __global TS *du, const long SE, const long SS, const int S,
                            __global TS *gw)
{
    ACC d[16];
    for (int e = 0; e < 16; ++e) d[e] = (ACC)0;
    for (int s = 0; s < S; ++s)
        for (int e = 0; e < 16; ++e) d[e] += LOAD_T(du, s * SS + e * SE);
    ACC r[3][4];   // G^T D (3 x 4)
    for (int j = 0; j < 4; ++j) {
        const ACC a = d[j], b = d[4 + j], c = d[8 + j], e = d[12 + j];
        r[0][j] = a + (ACC)0.5 * (b + c);
        r[1][j] = (ACC)0.5 * (b - c);
        r[2][j] = (ACC)0.5 * (b + c) + e;
    }
    for (int i = 0; i < 3; ++i) {   // (G^T D) G
        const ACC a = r[i][0], b = r[i][1], c = r[i][2], e = r[i][3];
        STORE_T(gw, i * 3 + 0, a + (ACC)0.5 * (b + c));
        STORE_T(gw, i * 3 + 1, (ACC)0.5 * (b - c));
        STORE_T(gw, i * 3 + 2, (ACC)0.5 * (b + c) + e);
    }
}

__kernel void winograd_grad_filter_2x2_3x3(__global const TS *du, __global TS *gw, const long gw_off,
                                           const int K, const int C, const int S)
{
    const int i = get_global_id(0);
    if (i >= K * C) return;
    const long SE = (long)K * C, SS = 16 * SE;
    grad_filter_one(du + i, SE, SS, S, gw + gw_off + (long)i * 9);
}

// -- several transforms in one launch (GPUs) --------------------------------------------------------------
// winograd_transforms_2x2_3x3: up to four independent transforms of one convolution step in one 1-D launch
// (global: the items' sum rounded up to the work-group, local LOCAL), each item running one transform's
// work-item as its own kernel above would: items [0, nf) the filter transform (f_*: winograd_filter's
// arguments, item i = filter i), then na items of an input transform (a_*: winograd_input's, t fastest,
// then c, then n, as FLAT), nb of a second input transform (b_*), nz of a grad-output transform (z_*). A
// forward pass takes the filter and its input (2 launches -> 1); a backward pass the rotated filter and
// grad_y's input tiles (the input gradient), x's input tiles and grad_y's Z (the weight gradient): 4 -> 1.
// The same arithmetic per element as the separate kernels: the same bits.
#define XFORM_ARGS(p) __global const TS *p##_x, const long p##_x_off, __global TS *p##_v, const int p##_n0,  \
    const int p##_NB, const int p##_C, const int p##_H, const int p##_W, const int p##_TW, const int p##_TT, \
    const int p##_PH, const int p##_PW, const long p##_items

__kernel void winograd_transforms_2x2_3x3(__global const TS *f_w, const long f_w_off, __global TS *f_u,
                                          const int f_K, const int f_C, const long f_SE, const long f_SK,
                                          const long f_SC, const int f_flip, const long f_items, XFORM_ARGS(a),
                                          XFORM_ARGS(b), __global const TS *z_gy, const long z_gy_off,
                                          __global TS *z_z, const int z_n0, const int z_NB, const int z_K,
                                          const int z_OH, const int z_OW, const int z_TW, const int z_TT,
                                          const long z_items)
{
    long i = get_global_id(0);
    if (i < f_items) {
        filter_one((int)i, f_w, f_w_off, f_u, f_K, f_C, f_SE, f_SK, f_SC, f_flip);
        return;
    }
    i -= f_items;
    if (i < a_items) {
        const int t = (int)(i % a_TT), c = (int)((i / a_TT) % a_C), n = (int)(i / a_TT / a_C);
        input_one(t, c, n, a_x, a_x_off, a_v, a_n0, a_NB, a_C, a_H, a_W, a_TW, a_TT, a_PH, a_PW);
        return;
    }
    i -= a_items;
    if (i < b_items) {
        const int t = (int)(i % b_TT), c = (int)((i / b_TT) % b_C), n = (int)(i / b_TT / b_C);
        input_one(t, c, n, b_x, b_x_off, b_v, b_n0, b_NB, b_C, b_H, b_W, b_TW, b_TT, b_PH, b_PW);
        return;
    }
    i -= b_items;
    if (i < z_items) {
        const int t = (int)(i % z_TT), k = (int)((i / z_TT) % z_K), n = (int)(i / z_TT / z_K);
        grad_output_one(t, k, n, z_gy, z_gy_off, z_z, z_n0, z_NB, z_K, z_OH, z_OW, z_TW, z_TT);
    }
}

// -- CPU variants ----------------------------------------------------------------------------------
// A work-item computes CH tiles (or filters) into a private (16, CH) block, then stores it position by
// position (16 runs of CH contiguous values): stores interleaved across the 16 positions ran 10-20x
// slower on PoCL (LLVM does not vectorise them; bench/NOTES.md, convolution). CH divides the row
// (TW tiles, or the filters of the filter transforms): no ragged chunk, one branch-free path (two paths
// filling one block made PoCL keep it in memory).
#ifndef CH
#define CH 8
#endif
#define FCH 8              // filters per block in the filter transform (the last block may be partial)

#define STORE_BLOCK(out, SE, buf)                                                             \
    do {                                                                                     \
        for (int e_ = 0; e_ < 16; ++e_)                                                      \
            for (int j_ = 0; j_ < CH; ++j_) STORE_T(out, e_ * (SE) + j_, buf[e_][j_]);        \
    } while (0)

// buf[e][j] = (B^T d B)[e] of the 4x4 tile whose rows are d0..d3
#define INPUT_TO_BLOCK(buf, j, d0, d1, d2, d3)                                                \
    do {                                                                                     \
        const T4 r0_ = (d0) - (d2), r1_ = (d1) + (d2), r2_ = (d2) - (d1), r3_ = (d1) - (d3);  \
        buf[0][j] = r0_.x - r0_.z;  buf[1][j] = r0_.y + r0_.z;                              \
        buf[2][j] = r0_.z - r0_.y;  buf[3][j] = r0_.y - r0_.w;                              \
        buf[4][j] = r1_.x - r1_.z;  buf[5][j] = r1_.y + r1_.z;                              \
        buf[6][j] = r1_.z - r1_.y;  buf[7][j] = r1_.y - r1_.w;                              \
        buf[8][j] = r2_.x - r2_.z;  buf[9][j] = r2_.y + r2_.z;                              \
        buf[10][j] = r2_.z - r2_.y; buf[11][j] = r2_.y - r2_.w;                             \
        buf[12][j] = r3_.x - r3_.z; buf[13][j] = r3_.y + r3_.z;                             \
        buf[14][j] = r3_.z - r3_.y; buf[15][j] = r3_.y - r3_.w;                             \
    } while (0)

// buf[e][j] = (A dY A^T)[e] for the 2x2 block [[a, b], [c, d]] (see GRAD_OUT_STORE)
#define GRAD_OUT_TO_BLOCK(buf, j, a, b, c, d)                                                 \
    do {                                                                                     \
        const T p1 = (a) + (c), q1 = (b) + (d), p2 = (a) - (c), q2 = (b) - (d);               \
        buf[0][j] = (a);       buf[1][j] = (a) + (b);  buf[2][j] = (a) - (b);  buf[3][j] = -(b); \
        buf[4][j] = p1;        buf[5][j] = p1 + q1;    buf[6][j] = p1 - q1;    buf[7][j] = -q1;  \
        buf[8][j] = p2;        buf[9][j] = p2 + q2;    buf[10][j] = p2 - q2;   buf[11][j] = -q2; \
        buf[12][j] = -(c);     buf[13][j] = -(c) - (d); buf[14][j] = (d) - (c); buf[15][j] = (d); \
    } while (0)

// One work-item per row r of the 16 transformed matrices: U[e, k, c] for output channel r = k and its
// C filters, or with flip = 1 the rotated filters transposed, U[e, c, k] for r = c (backward data).
__kernel void winograd_filter_rows_2x2_3x3(__global const TS *w, const long w_off, __global TS *u,
                                           const int K, const int C, const int flip)
{
    const int r = get_global_id(0), R = flip ? C : K, Q = flip ? K : C;
    if (r >= R) return;
    const long SE = (long)K * C;
    // filter (r, q) starts at w[(r*C + q)*9], or w[(q*C + r)*9] transposed
    const long first = flip ? (long)r * 9 : (long)r * C * 9, step = flip ? (long)C * 9 : 9;
    for (int c0 = 0; c0 < Q; c0 += FCH) {
        T buf[16][FCH];
        const int count = min(FCH, Q - c0);
        for (int j = 0; j < FCH; ++j) {
            const __global TS *g = w + w_off + first + min(c0 + j, Q - 1) * step;
            T gg[4][3];
            for (int q = 0; q < 3; ++q) {
                const T a = FILTER_TAP(g, q), b = FILTER_TAP(g, 3 + q), d = FILTER_TAP(g, 6 + q);
                gg[0][q] = a;
                gg[1][q] = (T)0.5 * (a + b + d);
                gg[2][q] = (T)0.5 * (a - b + d);
                gg[3][q] = d;
            }
            for (int r = 0; r < 4; ++r) {
                const T a = gg[r][0], b = gg[r][1], d = gg[r][2];
                buf[r * 4 + 0][j] = a;
                buf[r * 4 + 1][j] = (T)0.5 * (a + b + d);
                buf[r * 4 + 2][j] = (T)0.5 * (a - b + d);
                buf[r * 4 + 3][j] = d;
            }
        }
        for (int e = 0; e < 16; ++e)
            for (int j = 0; j < count; ++j) STORE_T(u, e * SE + (long)r * Q + c0 + j, buf[e][j]);
    }
}

// One work-item per (tile row th, channel c, image n): the TW tiles of the row, CH at a time (the host
// picks CH dividing TW). Each chunk first copies its 4 x (2*CH + 2) input window into private memory,
// zero outside the image (clamped index, scaled by 0: no branches), then transforms from there.
__kernel void winograd_input_rows_2x2_3x3(__global const TS *x, const long x_off, __global TS *v,
                                          const int n0, const int NB, const int C, const int H, const int W,
                                          const int TW, const int TT, const int PH, const int PW, const int TH)
{
    const int th = get_global_id(0), c = get_global_id(1), n = get_global_id(2);
    if (th >= TH || c >= C || n >= NB) return;
    const __global TS *xc = x + x_off + ((long)(n0 + n) * C + c) * H * W;
    const int ih0 = th * 2 - PH;
    const long PT = (long)NB * TT, SE = (long)C * PT;
    __global TS *out = v + (long)c * PT + (long)n * TT + (long)th * TW;
    for (int t0 = 0; t0 < TW; t0 += CH) {
        T win[4][2 * CH + 2];
        const int iw0 = 2 * t0 - PW;
        for (int i = 0; i < 4; ++i) {
            const int ih = ih0 + i;
            const T keep = (ih >= 0 && ih < H) ? (T)1 : (T)0;
            const __global TS *r = xc + (long)clamp(ih, 0, H - 1) * W;
            for (int j = 0; j < 2 * CH + 2; ++j) {
                const int iw = iw0 + j;
                win[i][j] = LOAD_T(r, clamp(iw, 0, W - 1)) * ((iw >= 0 && iw < W) ? keep : (T)0);
            }
        }
        T buf[16][CH];
        for (int j = 0; j < CH; ++j) {
            const T4 d0 = (T4)(win[0][2 * j], win[0][2 * j + 1], win[0][2 * j + 2], win[0][2 * j + 3]);
            const T4 d1 = (T4)(win[1][2 * j], win[1][2 * j + 1], win[1][2 * j + 2], win[1][2 * j + 3]);
            const T4 d2 = (T4)(win[2][2 * j], win[2][2 * j + 1], win[2][2 * j + 2], win[2][2 * j + 3]);
            const T4 d3 = (T4)(win[3][2 * j], win[3][2 * j + 1], win[3][2 * j + 2], win[3][2 * j + 3]);
            INPUT_TO_BLOCK(buf, j, d0, d1, d2, d3);
        }
        STORE_BLOCK(out + t0, SE, buf);
    }
}

// One work-item per (tile row th, output channel k, image n): the two output rows of its TW tiles.
__kernel void winograd_output_rows_2x2_3x3(__global const TS *m, __global const TS *bias, const long b_off,
                                           const int has_bias, __global TS *y, const long y_off,
                                           const int n0, const int NB, const int K, const int OH, const int OW,
                                           const int TW, const int TT, const int TH)
{
    const int th = get_global_id(0), k = get_global_id(1), n = get_global_id(2);
    if (th >= TH || k >= K || n >= NB) return;
    const long PT = (long)NB * TT, SE = (long)K * PT;
    const __global TS *in = m + (long)k * PT + (long)n * TT + (long)th * TW;
    const T b = has_bias ? LOAD_T(bias, b_off + k) : (T)0;
    const int oh0 = th * 2;
    __global TS *y0 = y + y_off + ((long)(n0 + n) * K + k) * OH * OW + (long)oh0 * OW;
    __global TS *y1 = y0 + (oh0 + 1 < OH ? OW : 0);   // a last odd row: row 1 is never stored
    const bool two_rows = oh0 + 1 < OH;
    for (int t0 = 0; t0 < TW; t0 += CH) {
        T buf[16][CH];
        for (int e = 0; e < 16; ++e)
            for (int j = 0; j < CH; ++j) buf[e][j] = LOAD_T(in, e * SE + t0 + j);
        T out0[2 * CH], out1[2 * CH];
        for (int j = 0; j < CH; ++j) {
            const T a00 = buf[0][j] + buf[4][j] + buf[8][j], a01 = buf[1][j] + buf[5][j] + buf[9][j];
            const T a02 = buf[2][j] + buf[6][j] + buf[10][j], a03 = buf[3][j] + buf[7][j] + buf[11][j];
            const T a10 = buf[4][j] - buf[8][j] - buf[12][j], a11 = buf[5][j] - buf[9][j] - buf[13][j];
            const T a12 = buf[6][j] - buf[10][j] - buf[14][j], a13 = buf[7][j] - buf[11][j] - buf[15][j];
            out0[2 * j] = APPLY_ACT(a00 + a01 + a02 + b);
            out0[2 * j + 1] = APPLY_ACT(a01 - a02 - a03 + b);
            out1[2 * j] = APPLY_ACT(a10 + a11 + a12 + b);
            out1[2 * j + 1] = APPLY_ACT(a11 - a12 - a13 + b);
        }
        const int ow0 = 2 * t0;
        if (ow0 + 2 * CH <= OW) {
            for (int j = 0; j < 2 * CH; ++j) STORE_T(y0, ow0 + j, out0[j]);
            if (two_rows)
                for (int j = 0; j < 2 * CH; ++j) STORE_T(y1, ow0 + j, out1[j]);
        } else {   // odd OW: the last tile's right column lies outside
            for (int j = 0; j < OW - ow0; ++j) STORE_T(y0, ow0 + j, out0[j]);
            if (two_rows)
                for (int j = 0; j < OW - ow0; ++j) STORE_T(y1, ow0 + j, out1[j]);
        }
    }
}

// One work-item per (tile row th, channel k, image n) of grad_y: Z for the TW tiles of the row, CH at a
// time through a private 2 x 2*CH window (zero outside OH x OW), as the input transform.
__kernel void winograd_grad_output_rows_2x2_3x3(__global const TS *gy, const long gy_off, __global TS *z,
                                                const int n0, const int NB, const int K, const int OH,
                                                const int OW, const int TW, const int TT, const int TH)
{
    const int th = get_global_id(0), k = get_global_id(1), n = get_global_id(2);
    if (th >= TH || k >= K || n >= NB) return;
    const __global TS *g0 = gy + gy_off + ((long)(n0 + n) * K + k) * OH * OW + (long)(2 * th) * OW;
    const bool two_rows = 2 * th + 1 < OH;
    const __global TS *g1 = two_rows ? g0 + OW : g0;
    const T keep1 = two_rows ? (T)1 : (T)0;
    const long PT = (long)NB * TT, SE = (long)K * PT;
    __global TS *out = z + (long)k * PT + (long)n * TT + (long)th * TW;
    for (int t0 = 0; t0 < TW; t0 += CH) {
        T win[2][2 * CH];
        for (int j = 0; j < 2 * CH; ++j) {
            const int ow = 2 * t0 + j, oc = min(ow, OW - 1);
            const T in = ow < OW ? (T)1 : (T)0;
            win[0][j] = in * LOAD_T(g0, oc);
            win[1][j] = (in * keep1) * LOAD_T(g1, oc);
        }
        T buf[16][CH];
        for (int j = 0; j < CH; ++j)
            GRAD_OUT_TO_BLOCK(buf, j, win[0][2 * j], win[0][2 * j + 1], win[1][2 * j], win[1][2 * j + 1]);
        STORE_BLOCK(out + t0, SE, buf);
    }
}

// One work-item per output channel k: dW[k, c] for its C filters.
__kernel void winograd_grad_filter_rows_2x2_3x3(__global const TS *du, __global TS *gw, const long gw_off,
                                                const int K, const int C, const int S)
{
    const int k = get_global_id(0);
    if (k >= K) return;
    const long SE = (long)K * C, SS = 16 * SE;
    for (int c = 0; c < C; ++c)
        grad_filter_one(du + (long)k * C + c, SE, SS, S, gw + gw_off + ((long)k * C + c) * 9);
}
