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
//   has_in: grad_x is written plus gin's row (x's gradient summed so far from the other ops that read it,
//   netcl.autograd.engine.partial_gradient), rounded once: no add launch of its own.
// LOCAL is 1 on CPUs (no barrier cost, rows spread over cores) and 128-256 on GPUs.
// Dtypes: every floating one of common.cl. x, y, w, b and the gradients are T (read with LOAD_T, written
// with STORE_T: float16/bfloat16 storage, float arithmetic); mean and rstd are ACC (float32 statistics for
// half storage). PARAM_F32 (float16/bfloat16 T only): w, b and their gradients are float32 (P), as
// autocast leaves a model's float32 parameters: no cast of them either way.
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

// P: the parameters' storage, their loads (LDP) and their gradients' stores (STP)
#ifdef PARAM_F32
#define P float
#define LDP(p, i) ((ACC)(p)[i])
#define STP(p, i, v) ((p)[i] = (float)(v))
#else
#define P T
#define LDP(p, i) LD(p, i)
#define STP(p, i, v) STORE_T(p, i, v)
#endif

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

__kernel void row_norm_forward(__global const T *x, const long x_off, __global const P *w, __global const P *b,
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
        if (has_w) v *= LDP(w, p);
        if (has_b) v += LDP(b, p);
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
                                __global const P *w, const int has_w, __global const ACC *mean_in,
                                __global const ACC *rstd_in, __global T *gx, __global const T *gin,
                                const long gin_off, const int has_in, __global P *gw, __global P *gb,
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
            if (has_w) g *= LDP(w, (pbase + i) / PDIV);
            s1 += g;
            s2 += g * (LD(xr, i) - mean) * rstd;
        }
        s1 = rms ? (ACC)0 : group_sum(s1, scratch) / (ACC)L;
        s2 = group_sum(s2, scratch) / (ACC)L;
        __global T *gxr = gx + (long)r * L;
        const __global T *inr = gin + gin_off + (long)r * L;
        for (int i = lid; i < L; i += LOCAL) {
            ACC g = LD(gr, i);
            if (has_w) g *= LDP(w, (pbase + i) / PDIV);
            const ACC xhat = (LD(xr, i) - mean) * rstd;
            ACC v = rstd * (g - s1 - xhat * s2);
            if (has_in) v += LD(inr, i);  // x's gradient summed so far (has_in, at the top)
            STORE_T(gxr, i, v);
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
    STP(gw, p, sw);
    STP(gb, p, sb);
}

// LayerNorm / RMSNorm rows on GPUs with VW elements a work-item (row_norm_forward_vec4,
// row_norm_backward_vec4: PG = PDIV = 1, L % VW == 0, rows and parameters on VW-element boundaries; not
// float64): one 16-byte access per work-item and pass instead of VW scalar ones: float4 (VW 4), and for
// float16/bfloat16 eight values (VW 8: half.cl's raw-bits loads on NVIDIA, 32-bit words for bfloat16 there);
// VW 4 for a half row that is not on 8-element boundaries (8 bytes an access).
// Same arguments as the scalar kernels; the backward's parameter gradients come from the reduction
// engine (netcl.ops.norm), so it has no parameter part. Sums in another order than the scalar kernels.
#ifndef USE_FP64
#ifndef VW
#define VW 4
#endif
#define FV_(n) float##n
#define FV(n) FV_(n)
#define floatv FV(VW)
#if VW == 8 && defined(IS_HALF) && defined(NC_NVIDIA)
#define LOADV(p, i) nc_ldh8((p) + (i))
#define STOREV(p, i, v) nc_sth8((v), (p) + (i))
#elif VW == 8 && defined(IS_HALF)
// two 4-wide accesses elsewhere: PoCL 3's vloada_half8 / vstorea_half8 corrupted the host heap in these
// kernels (work-groups of 8, rows of 40; clean under Oclgrind)
#define LOADV(p, i) ((float8)(vloada_half4(0, (p) + (i)), vloada_half4(0, (p) + (i) + 4)))
#define STOREV(p, i, v) do { vstorea_half4((v).lo, 0, (p) + (i)); vstorea_half4((v).hi, 0, (p) + (i) + 4); } while (0)
#elif VW == 8 && defined(IS_BF16) && defined(NC_BF16_CVT)
#define LOADV(p, i) nc_ldbf8((p) + (i))
#define STOREV(p, i, v) nc_stbf8((v), (p) + (i))
#elif VW == 4 && defined(IS_BF16) && defined(NC_BF16_CVT)
#define LOADV(p, i) nc_ldbf4((p) + (i))
#define STOREV(p, i, v) nc_stbf4((v), (p) + (i))
#elif VW == 8 && defined(IS_BF16)
#define LOADV(p, i) as_float8(convert_uint8(*(const __global ushort8 *)((p) + (i))) << 16)
#define STOREV(p, i, v) (*(__global ushort8 *)((p) + (i)) = (ushort8)(nc_float_to_bf16((v).s0), \
    nc_float_to_bf16((v).s1), nc_float_to_bf16((v).s2), nc_float_to_bf16((v).s3), nc_float_to_bf16((v).s4), \
    nc_float_to_bf16((v).s5), nc_float_to_bf16((v).s6), nc_float_to_bf16((v).s7)))
#elif VW == 4 && defined(IS_HALF)
#define LOADV(p, i) nc_ldh4((p) + (i))
#define STOREV(p, i, v) nc_sth4((v), (p) + (i))
#elif VW == 4 && defined(IS_BF16)
#define LOADV(p, i) as_float4(convert_uint4(*(const __global ushort4 *)((p) + (i))) << 16)
#define STOREV(p, i, v) (*(__global ushort4 *)((p) + (i)) = (ushort4)(nc_float_to_bf16((v).x), \
    nc_float_to_bf16((v).y), nc_float_to_bf16((v).z), nc_float_to_bf16((v).w)))
#elif VW == 4
#define LOADV(p, i) (*(const __global float4 *)((p) + (i)))
#define STOREV(p, i, v) (*(__global float4 *)((p) + (i)) = (v))
#else
#error "norm.cl: VW is 4, or 8 for float16 / bfloat16"
#endif
// the parameters' VW values: float32 ones (PARAM_F32) by vload, else as the rows
#if defined(PARAM_F32) && VW == 8
#define LOADVP(p, i) vload8(0, (p) + (i))
#elif defined(PARAM_F32)
#define LOADVP(p, i) vload4(0, (p) + (i))
#else
#define LOADVP(p, i) LOADV(p, i)
#endif
#if VW == 8
#define SUMV(v) ((((v).s0 + (v).s1) + ((v).s2 + (v).s3)) + (((v).s4 + (v).s5) + ((v).s6 + (v).s7)))
#else
#define SUMV(v) (((v).x + (v).y) + ((v).z + (v).w))
#endif

__kernel void row_norm_forward_vec4(__global const T *x, const long x_off, __global const P *w,
                                    __global const P *b, const int has_w, const int has_b, __global T *y,
                                    __global ACC *mean_out, __global ACC *rstd_out, const int ROWS, const int L,
                                    const int PG, const int PDIV, const int rms, const ACC eps)
{
    __local ACC scratch[LOCAL];
    const int r = get_group_id(0), lid = get_local_id(0);
    if (r >= ROWS) return;
    const __global T *xr = x + x_off + (long)r * L;
    float mean = 0.0f;
    if (!rms) {
        floatv s = (floatv)(0.0f);
        for (int i = VW * lid; i < L; i += VW * LOCAL) s += LOADV(xr, i);
        mean = group_sum(SUMV(s), scratch) / (float)L;
    }
    floatv ss = (floatv)(0.0f);
    for (int i = VW * lid; i < L; i += VW * LOCAL) {
        const floatv d = LOADV(xr, i) - mean;
        ss += d * d;
    }
    const float rstd = rsqrt(group_sum(SUMV(ss), scratch) / (float)L + eps);
    __global T *yr = y + (long)r * L;
    for (int i = VW * lid; i < L; i += VW * LOCAL) {
        floatv v = (LOADV(xr, i) - mean) * rstd;
        if (has_w) v *= LOADVP(w, i);
        if (has_b) v += LOADVP(b, i);
#if ACT == ACT_RELU
        v = fmax(v, (floatv)(0.0f));
#endif
        STOREV(yr, i, v);
    }
    if (lid == 0) {
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

__kernel void row_norm_backward_vec4(__global const T *gy, const long gy_off, __global const T *x,
                                     const long x_off, __global const P *w, const int has_w,
                                     __global const ACC *mean_in, __global const ACC *rstd_in, __global T *gx,
                                     __global const T *gin, const long gin_off, const int has_in,
                                     const int ROWS, const int L, const int rms)
{
    __local ACC scratch[LOCAL];
    const int r = get_group_id(0), lid = get_local_id(0);
    if (r >= ROWS) return;
    const __global T *xr = x + x_off + (long)r * L;
    const __global T *gr = gy + gy_off + (long)r * L;
    const float mean = rms ? 0.0f : mean_in[r], rstd = rstd_in[r];
    floatv s1 = (floatv)(0.0f), s2 = (floatv)(0.0f);  // sum(g'), sum(g' * xhat) with g' = gy * w
    for (int i = VW * lid; i < L; i += VW * LOCAL) {
        floatv g = LOADV(gr, i);
        if (has_w) g *= LOADVP(w, i);
        s1 += g;
        s2 += g * (LOADV(xr, i) - mean) * rstd;
    }
    const float m1 = rms ? 0.0f : group_sum(SUMV(s1), scratch) / (float)L;
    const float m2 = group_sum(SUMV(s2), scratch) / (float)L;
    __global T *gxr = gx + (long)r * L;
    const __global T *inr = gin + gin_off + (long)r * L;
    for (int i = VW * lid; i < L; i += VW * LOCAL) {
        floatv g = LOADV(gr, i);
        if (has_w) g *= LOADVP(w, i);
        const floatv xhat = (LOADV(xr, i) - mean) * rstd;
        floatv v = rstd * (g - m1 - xhat * m2);
        if (has_in) v += LOADV(inr, i);  // x's gradient summed so far (has_in, at the top)
        STOREV(gxr, i, v);
    }
}
#endif
