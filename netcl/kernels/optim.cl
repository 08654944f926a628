/* Fused optimizer updates: one launch updates up to N_TENSORS parameters (PyTorch's formulas).
 *
 * Work layout: 1-D, one work-item per chunk of ITEMS consecutive elements of one tensor, over all
 * tensors of the launch laid end to end (global size = sum of ceil(n_i / ITEMS)); a work-item finds
 * its tensor by walking the chunk counts. ITEMS is 1 on GPUs (coalesced) and 64 on CPUs (few
 * work-groups, a vectorisable loop; Adam/AdamW run that loop 8 or 4 lanes at a time: float8/double4).
 * Memory: reads each grad, reads and writes each parameter and its state buffers (s1..s3), once.
 *
 * Defines:
 *   T          storage/arithmetic type: float or double (USE_FP64 enables cl_khr_fp64)
 *   N_TENSORS  tensors per launch, 1..8
 *   ITEMS      consecutive elements per work-item (default 1)
 *   OPT        the rule, by name (netcl.ops.update passes the name, never its value):
 *              OPT_SGD (sa momentum buffer), OPT_ADAM (Adam/AdamW: sa exp_avg, sb exp_avg_sq),
 *              OPT_RMSPROP (sa square_avg, sb grad_avg, sc momentum buffer)
 * Scalars (HYPER_ARGS, all T unless noted; the host passes them by these names):
 *   OPT_SGD     lr, momentum, dampening, weight_decay, nesterov (int), first_step (int: buf = g)
 *   OPT_ADAM    lr, beta1, beta2, eps, weight_decay, decoupled (int: AdamW), bias_correction1,
 *               bias_correction2_sqrt
 *   OPT_RMSPROP lr, alpha, eps, weight_decay, momentum, centered (int)
 */
#include "common.cl"

#ifndef T
#define T float
#endif
#ifndef N_TENSORS
#define N_TENSORS 1
#endif
#define OPT_SGD 1
#define OPT_ADAM 2
#define OPT_RMSPROP 3
#ifndef OPT
#define OPT OPT_ADAM  /* the clipping programs compile an update rule too */
#endif

#define TENSOR_ARGS(i) __global T* p##i, long po##i, __global const T* g##i, long go##i, \
    __global T* sa##i, __global T* sb##i, __global T* sc##i, long n##i

#if OPT == OPT_SGD
#define HYPER_ARGS T lr, T momentum, T dampening, T weight_decay, int nesterov, int first_step
inline void update(__global T* p, __global const T* g, __global T* sa, __global T* sb, __global T* sc,
                   long i, long j, HYPER_ARGS) {
    T grad = g[j];
    T param = p[i];
    if (weight_decay != (T)0) grad = grad + weight_decay * param;
    if (momentum != (T)0) {
        T buf = first_step ? grad : momentum * sa[i] + ((T)1 - dampening) * grad;
        sa[i] = buf;
        grad = nesterov ? grad + momentum * buf : buf;
    }
    p[i] = param - lr * grad;
}
#define HYPER_PASS lr, momentum, dampening, weight_decay, nesterov, first_step

#elif OPT == OPT_ADAM
#define HYPER_ARGS T lr, T beta1, T beta2, T eps, T weight_decay, int decoupled, T bias_correction1, \
    T bias_correction2_sqrt
inline void update(__global T* p, __global const T* g, __global T* sa, __global T* sb, __global T* sc,
                   long i, long j, HYPER_ARGS) {
    T grad = g[j];
    T param = p[i];
    if (weight_decay != (T)0) {
        if (decoupled) param = param * ((T)1 - lr * weight_decay);
        else grad = grad + weight_decay * param;
    }
    T m = sa[i] + ((T)1 - beta1) * (grad - sa[i]);          /* exp_avg.lerp_(grad, 1 - beta1) */
    T v = beta2 * sb[i] + ((T)1 - beta2) * grad * grad;
    sa[i] = m;
    sb[i] = v;
    T denom = sqrt(v) / bias_correction2_sqrt + eps;
    p[i] = param - (lr / bias_correction1) * (m / denom);
}
#define HYPER_PASS lr, beta1, beta2, eps, weight_decay, decoupled, bias_correction1, bias_correction2_sqrt

/* The same update over elements [j0, j1) of one tensor, LANES at a time (ITEMS > 1: CPUs, where
 * the per-element form runs as scalar code: sqrt and the division dominate). Same expressions per
 * lane as update(); the tail that does not fill the lanes goes through update(). Vectors stay at 32
 * bytes (float8, double4): PoCL 3.0 (LLVM 14) miscompiles or aborts on library calls (vloadn, sqrt)
 * with 512-bit vectors on AVX-512 CPUs it does not know (see gemm_cpu.cl). */
#ifdef USE_FP64
#define LANES 4
#else
#define LANES 8
#endif
#define OPT_CAT_(a, b) a##b
#define OPT_CAT(a, b) OPT_CAT_(a, b)
#define VT OPT_CAT(T, LANES)
#define VLOAD OPT_CAT(vload, LANES)
#define VSTORE OPT_CAT(vstore, LANES)
#define HAS_RANGE_UPDATE 1
inline void update_range(__global T* p, __global const T* g, __global T* sa, __global T* sb, __global T* sc,
                         long j0, long j1, HYPER_ARGS) {
    long j = j0;
    for (; j + LANES <= j1; j += LANES) {
        VT grad = VLOAD(0, g + j);
        VT param = VLOAD(0, p + j);
        if (weight_decay != (T)0) {
            if (decoupled) param = param * ((T)1 - lr * weight_decay);
            else grad = grad + weight_decay * param;
        }
        VT m0 = VLOAD(0, sa + j);
        VT m = m0 + ((T)1 - beta1) * (grad - m0);
        VT v = beta2 * VLOAD(0, sb + j) + ((T)1 - beta2) * grad * grad;
        VSTORE(m, 0, sa + j);
        VSTORE(v, 0, sb + j);
        VT denom = sqrt(v) / bias_correction2_sqrt + eps;
        VSTORE(param - (lr / bias_correction1) * (m / denom), 0, p + j);
    }
    for (; j < j1; ++j) update(p, g, sa, sb, sc, j, j, HYPER_PASS);
}

#elif OPT == OPT_RMSPROP
#define HYPER_ARGS T lr, T alpha, T eps, T weight_decay, T momentum, int centered
inline void update(__global T* p, __global const T* g, __global T* sa, __global T* sb, __global T* sc,
                   long i, long j, HYPER_ARGS) {
    T grad = g[j];
    T param = p[i];
    if (weight_decay != (T)0) grad = grad + weight_decay * param;
    T sq = alpha * sa[i] + ((T)1 - alpha) * grad * grad;
    sa[i] = sq;
    T avg;
    if (centered) {
        T ga = sb[i] + ((T)1 - alpha) * (grad - sb[i]);      /* grad_avg.lerp_(grad, 1 - alpha) */
        sb[i] = ga;
        avg = sqrt(sq - ga * ga) + eps;
    } else {
        avg = sqrt(sq) + eps;
    }
    if (momentum > (T)0) {
        T buf = momentum * sc[i] + grad / avg;
        sc[i] = buf;
        p[i] = param - lr * buf;
    } else {
        p[i] = param - lr * (grad / avg);
    }
}
#define HYPER_PASS lr, alpha, eps, weight_decay, momentum, centered
#endif

#ifndef ITEMS
#define ITEMS 1
#endif

/* State buffers are contiguous from 0, parameters and grads may start at an offset (po, go).
 * Work-item k takes ITEMS consecutive elements of one tensor (its k-th chunk over all tensors). */
#if defined(HAS_RANGE_UPDATE) && ITEMS > 1
#define TRY(i) { long chunks = (n##i + ITEMS - 1) / ITEMS; \
    if (k < chunks) { \
        update_range(p##i + po##i, g##i + go##i, sa##i, sb##i, sc##i, k * ITEMS, \
                     min((k + 1) * ITEMS, n##i), HYPER_PASS); \
        return; } \
    k -= chunks; }
#else
#define TRY(i) { long chunks = (n##i + ITEMS - 1) / ITEMS; \
    if (k < chunks) { \
        long end = min((k + 1) * ITEMS, n##i); \
        for (long j = k * ITEMS; j < end; ++j) \
            update(p##i + po##i, g##i + go##i, sa##i, sb##i, sc##i, j, j, HYPER_PASS); \
        return; } \
    k -= chunks; }
#endif

__kernel void optimizer_step(
    TENSOR_ARGS(0)
#if N_TENSORS > 1
    , TENSOR_ARGS(1)
#endif
#if N_TENSORS > 2
    , TENSOR_ARGS(2)
#endif
#if N_TENSORS > 3
    , TENSOR_ARGS(3)
#endif
#if N_TENSORS > 4
    , TENSOR_ARGS(4)
#endif
#if N_TENSORS > 5
    , TENSOR_ARGS(5)
#endif
#if N_TENSORS > 6
    , TENSOR_ARGS(6)
#endif
#if N_TENSORS > 7
    , TENSOR_ARGS(7)
#endif
    , HYPER_ARGS)
{
    long k = get_global_id(0);
    TRY(0)
#if N_TENSORS > 1
    TRY(1)
#endif
#if N_TENSORS > 2
    TRY(2)
#endif
#if N_TENSORS > 3
    TRY(3)
#endif
#if N_TENSORS > 4
    TRY(4)
#endif
#if N_TENSORS > 5
    TRY(5)
#endif
#if N_TENSORS > 6
    TRY(6)
#endif
#if N_TENSORS > 7
    TRY(7)
#endif
}

/* ---- gradient-norm clipping ------------------------------------------------------------------
 * sum_squares: one work-group of WG items sums x[off + i]^2 over n elements into partial[slot]
 *   (global = local = WG; a fixed-order tree so the result is reproducible).
 * clip_coef: one work-item adds partial[0..count) (fixed order), writes norm[0] = sqrt(sum) and
 *   norm[1] = min(1, max_norm / (norm + 1e-6)).
 * scale_by: x[off + i] *= norm[1] for i < n (1-D, one work-item per element).
 */
#ifndef WG
#define WG 256
#endif

__kernel void sum_squares(__global const T* x, long off, long n, __global T* partial, int slot) {
    __local T acc[WG];
    int lid = get_local_id(0);
    T s = (T)0;
    for (long i = lid; i < n; i += WG) { T v = x[off + i]; s += v * v; }
    acc[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) acc[lid] += acc[lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) partial[slot] = acc[0];
}

__kernel void clip_coef(__global const T* partial, int count, T max_norm, __global T* norm) {
    if (get_global_id(0) != 0) return;
    T s = (T)0;
    for (int i = 0; i < count; ++i) s += partial[i];
    T total = sqrt(s);
    norm[0] = total;
    T coef = max_norm / (total + (T)1e-6);
    norm[1] = coef < (T)1 ? coef : (T)1;
}

__kernel void scale_by(__global T* x, long off, long n, __global const T* norm) {
    long i = get_global_id(0);
    if (i < n) x[off + i] *= norm[1];
}
