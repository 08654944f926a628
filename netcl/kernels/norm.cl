// Normalisation layers, one launch per direction: LayerNorm / RMSNorm / GroupNorm (row kernels),
// forward and backward, with optional fused relu (BatchNorm: norm_batch.cl).
//
// Row norms see the input as ROWS x L contiguous rows; every row is normalised on its own:
//   LayerNorm: rows = prod(leading dims), L = prod(normalized_shape), parameter of element i is i.
//   GroupNorm: rows = N*G, L = (C/G)*HW (a group of one sample is contiguous in NCHW), parameter of
//   element i of row r is ((r % G)*L + i) / HW, i.e. its channel. Written generally as
//   param(r, i) = ((r % PG)*L + i) / PDIV with (PG, PDIV) = (1, 1) for LayerNorm, (G, HW) for GroupNorm.
//   RMSNorm (rms=1) skips the mean: y = x * rsqrt(mean(x^2) + eps) * w.
// row_norm_forward: global (ROWS*LOCAL), local (LOCAL); one work-group per row: two-pass mean and
//   variance in ACC (sum, then sum of squared deviations: no cancellation), then writes y, mean, rstd.
// row_norm_backward: global ((ROWS + ceil(NPARAM/LOCAL))*LOCAL), local (LOCAL). Work-groups below
//   ROWS each take one row and write grad_x; the rest each take LOCAL parameters and write grad_w,
//   grad_b by summing over the rows that use them. One launch, no atomics.
// LOCAL is 1 on CPUs (no barrier cost, rows spread over cores) and 128-256 on GPUs.
// Dtypes: every floating one of common.cl. x, y, w, b and the gradients are T (read with LOAD_T, written
// with STORE_T: float16/bfloat16 storage, float arithmetic); mean and rstd are ACC (float32 statistics for
// half storage).
// Memory: forward reads x twice and writes y once;
//   backward reads x and grad_y twice, writes grad_x once.

#include "common.cl"

#ifndef T
#define T float            // storage type
#endif
#ifndef ACC
#define ACC float          // accumulation type (float for float32 storage, double for float64)
#endif
#ifndef LOCAL
#define LOCAL 1            // work-group size, a power of two
#endif
// ACT (common.cl): ACT_RELU fuses a relu into the output (forward) / masks the gradient by it (backward)

#define LD(p, i) LOAD_T(p, i)

inline ACC group_sum(ACC v, __local ACC *scratch)
{
#if LOCAL == 1
    return v;
#else
    const int lid = get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LOCAL / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const ACC r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}

__kernel void row_norm_forward(__global const T *x, const long x_off, __global const T *w, __global const T *b,
                               const int has_w, const int has_b, __global T *y, __global ACC *mean_out,
                               __global ACC *rstd_out, const int ROWS, const int L, const int PG, const int PDIV,
                               const int rms, const ACC eps)
{
    __local ACC scratch[LOCAL];
    const int r = get_group_id(0), lid = get_local_id(0);
    if (r >= ROWS) return;
    const __global T *xr = x + x_off + (long)r * L;
    ACC mean = (ACC)0;
    if (!rms) {
        ACC s = (ACC)0;
        for (int i = lid; i < L; i += LOCAL) s += LD(xr, i);
        mean = group_sum(s, scratch) / (ACC)L;
    }
    ACC ss = (ACC)0;
    for (int i = lid; i < L; i += LOCAL) {
        const ACC d = LD(xr, i) - mean;
        ss += d * d;
    }
    const ACC rstd = rsqrt(group_sum(ss, scratch) / (ACC)L + eps);
    const int pbase = (r % PG) * L;
    __global T *yr = y + (long)r * L;
    for (int i = lid; i < L; i += LOCAL) {
        ACC v = (LD(xr, i) - mean) * rstd;
        const int p = (pbase + i) / PDIV;
        if (has_w) v *= LD(w, p);
        if (has_b) v += LD(b, p);
#if ACT == ACT_RELU
        v = fmax(v, (ACC)0);
#endif
        STORE_T(yr, i, v);
    }
    if (lid == 0) {
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

__kernel void row_norm_backward(__global const T *gy, const long gy_off, __global const T *x, const long x_off,
                                __global const T *w, const int has_w, __global const ACC *mean_in,
                                __global const ACC *rstd_in, __global T *gx, __global T *gw, __global T *gb,
                                const int ROWS, const int L, const int PG, const int PDIV, const int NPARAM,
                                const int rms)
{
    __local ACC scratch[LOCAL];
    const int grp = get_group_id(0), lid = get_local_id(0);
    if (grp < ROWS) {
        const int r = grp;
        const __global T *xr = x + x_off + (long)r * L;
        const __global T *gr = gy + gy_off + (long)r * L;
        const ACC mean = rms ? (ACC)0 : mean_in[r], rstd = rstd_in[r];
        const int pbase = (r % PG) * L;
        ACC s1 = (ACC)0, s2 = (ACC)0;  // sum(g'), sum(g' * xhat) with g' = gy * w
        for (int i = lid; i < L; i += LOCAL) {
            ACC g = LD(gr, i);
            if (has_w) g *= LD(w, (pbase + i) / PDIV);
            s1 += g;
            s2 += g * (LD(xr, i) - mean) * rstd;
        }
        s1 = rms ? (ACC)0 : group_sum(s1, scratch) / (ACC)L;
        s2 = group_sum(s2, scratch) / (ACC)L;
        __global T *gxr = gx + (long)r * L;
        for (int i = lid; i < L; i += LOCAL) {
            ACC g = LD(gr, i);
            if (has_w) g *= LD(w, (pbase + i) / PDIV);
            const ACC xhat = (LD(xr, i) - mean) * rstd;
            STORE_T(gxr, i, rstd * (g - s1 - xhat * s2));
        }
        return;
    }
    // parameter part: one work-item per parameter, summing over the rows and elements that use it
    const int p = (grp - ROWS) * LOCAL + lid;
    if (p >= NPARAM) return;
    const int g = (p * PDIV) / L;        // row residue (group) that holds parameter p
    const int i0 = p * PDIV - g * L;     // its first element inside such a row
    ACC sw = (ACC)0, sb = (ACC)0;
    for (int r = g; r < ROWS; r += PG) {
        const ACC mean = rms ? (ACC)0 : mean_in[r], rstd = rstd_in[r];
        const __global T *xr = x + x_off + (long)r * L + i0;
        const __global T *gr = gy + gy_off + (long)r * L + i0;
        for (int i = 0; i < PDIV; ++i) {
            const ACC gv = LD(gr, i);
            sw += gv * (LD(xr, i) - mean) * rstd;
            sb += gv;
        }
    }
    STORE_T(gw, p, sw);
    STORE_T(gb, p, sb);
}

// LayerNorm / RMSNorm rows on GPUs with 4 elements a work-item (row_norm_forward_vec4,
// row_norm_backward_vec4: PG = PDIV = 1, L % 4 == 0, rows and parameters on 4-element boundaries; not
// float64): one 16-byte float4 / 8-byte half4 or bfloat16 ushort4 access per work-item and pass instead
// of four scalar ones (a half row otherwise issues as many loads as a float32 row for half the bytes).
// Same arguments as the scalar kernels; the backward's parameter gradients come from the reduction
// engine (netcl.ops.norm), so it has no parameter part. Sums in another order than the scalar kernels.
#ifndef USE_FP64
#if defined(IS_HALF)
#define LOAD4(p, i) vloada_half4(0, (p) + (i))
#define STORE4(p, i, v) vstorea_half4((v), 0, (p) + (i))
#elif defined(IS_BF16)
inline float4 nc_bf16x4_to_float4(const ushort4 h) { return as_float4(convert_uint4(h) << 16); }
#define LOAD4(p, i) nc_bf16x4_to_float4(*(const __global ushort4 *)((p) + (i)))
#define STORE4(p, i, v) (*(__global ushort4 *)((p) + (i)) = (ushort4)(nc_float_to_bf16((v).x), \
    nc_float_to_bf16((v).y), nc_float_to_bf16((v).z), nc_float_to_bf16((v).w)))
#else
#define LOAD4(p, i) (*(const __global float4 *)((p) + (i)))
#define STORE4(p, i, v) (*(__global float4 *)((p) + (i)) = (v))
#endif
#define SUM4(v) (((v).x + (v).y) + ((v).z + (v).w))

__kernel void row_norm_forward_vec4(__global const T *x, const long x_off, __global const T *w,
                                    __global const T *b, const int has_w, const int has_b, __global T *y,
                                    __global ACC *mean_out, __global ACC *rstd_out, const int ROWS, const int L,
                                    const int PG, const int PDIV, const int rms, const ACC eps)
{
    __local ACC scratch[LOCAL];
    const int r = get_group_id(0), lid = get_local_id(0);
    if (r >= ROWS) return;
    const __global T *xr = x + x_off + (long)r * L;
    float mean = 0.0f;
    if (!rms) {
        float4 s = (float4)0.0f;
        for (int i = 4 * lid; i < L; i += 4 * LOCAL) s += LOAD4(xr, i);
        mean = group_sum(SUM4(s), scratch) / (float)L;
    }
    float4 ss = (float4)0.0f;
    for (int i = 4 * lid; i < L; i += 4 * LOCAL) {
        const float4 d = LOAD4(xr, i) - mean;
        ss += d * d;
    }
    const float rstd = rsqrt(group_sum(SUM4(ss), scratch) / (float)L + eps);
    __global T *yr = y + (long)r * L;
    for (int i = 4 * lid; i < L; i += 4 * LOCAL) {
        float4 v = (LOAD4(xr, i) - mean) * rstd;
        if (has_w) v *= LOAD4(w, i);
        if (has_b) v += LOAD4(b, i);
#if ACT == ACT_RELU
        v = fmax(v, (float4)0.0f);
#endif
        STORE4(yr, i, v);
    }
    if (lid == 0) {
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

__kernel void row_norm_backward_vec4(__global const T *gy, const long gy_off, __global const T *x,
                                     const long x_off, __global const T *w, const int has_w,
                                     __global const ACC *mean_in, __global const ACC *rstd_in, __global T *gx,
                                     const int ROWS, const int L, const int rms)
{
    __local ACC scratch[LOCAL];
    const int r = get_group_id(0), lid = get_local_id(0);
    if (r >= ROWS) return;
    const __global T *xr = x + x_off + (long)r * L;
    const __global T *gr = gy + gy_off + (long)r * L;
    const float mean = rms ? 0.0f : mean_in[r], rstd = rstd_in[r];
    float4 s1 = (float4)0.0f, s2 = (float4)0.0f;  // sum(g'), sum(g' * xhat) with g' = gy * w
    for (int i = 4 * lid; i < L; i += 4 * LOCAL) {
        float4 g = LOAD4(gr, i);
        if (has_w) g *= LOAD4(w, i);
        s1 += g;
        s2 += g * (LOAD4(xr, i) - mean) * rstd;
    }
    const float m1 = rms ? 0.0f : group_sum(SUM4(s1), scratch) / (float)L;
    const float m2 = group_sum(SUM4(s2), scratch) / (float)L;
    __global T *gxr = gx + (long)r * L;
    for (int i = 4 * lid; i < L; i += 4 * LOCAL) {
        float4 g = LOAD4(gr, i);
        if (has_w) g *= LOAD4(w, i);
        const float4 xhat = (LOAD4(xr, i) - mean) * rstd;
        STORE4(gxr, i, rstd * (g - m1 - xhat * m2));
    }
}
#endif
