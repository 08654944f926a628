/* Fused optimizer updates: one launch updates up to N_TENSORS parameters (PyTorch's formulas).
 *
 * Work layout: 1-D, one work-item per chunk of ITEMS consecutive elements of one tensor, over all
 * tensors of the launch laid end to end (global size = sum of ceil(n_i / ITEMS)); a work-item finds
 * its tensor by walking the chunk counts. ITEMS is 1 on GPUs (coalesced) and 64 on CPUs (few
 * work-groups, a vectorisable loop; float32/float64 Adam/AdamW run that loop 8 or 4 lanes at a time:
 * float8/double4). Memory: reads each grad, reads and writes each parameter and its state buffers
 * (sa..sc) and master weights (mw), once.
 *
 * Defines:
 *   T, ACC     storage type of parameters and gradients (float, double, or half/bfloat16 through
 *              common.cl's LOAD_T/STORE_T) and the arithmetic and state type (float or double)
 *   MASTER     parameters are half/bfloat16 with float32 master weights mw (mixed precision): the
 *              update reads the master, writes it and the parameter rounded to T (one launch)
 *   FOUND_INF  an int flag on the device (found_inf[0], written by unscale_grads): when it is nonzero
 *              the launch changes nothing (an AMP step skipped on overflow, with no host sync)
 *   N_TENSORS  tensors per launch, 1..8
 *   ITEMS      consecutive elements per work-item (default 1)
 *   OPT        the rule, by name (netcl.ops.update passes the name, never its value):
 *              OPT_SGD (sa momentum buffer), OPT_ADAM (Adam/AdamW: sa exp_avg, sb exp_avg_sq, sc
 *              max_exp_avg_sq with amsgrad),
 *              OPT_RMSPROP (sa square_avg, sb grad_avg, sc momentum buffer)
 * Scalars (HYPER_ARGS, all ACC unless noted; the host passes them by these names):
 *   OPT_SGD     lr, momentum, dampening, weight_decay, nesterov (int), first_step (int: buf = g)
 *   OPT_ADAM    lr, beta1, beta2, eps, weight_decay, decoupled (int: AdamW), bias_correction1,
 *               bias_correction2_sqrt, amsgrad (int: sc max_exp_avg_sq, the largest exp_avg_sq so far,
 *               in the denominator)
 *   OPT_RMSPROP lr, alpha, eps, weight_decay, momentum, centered (int)
 */
#include "common.cl"

#ifndef T
#define T float
#endif
#ifndef ACC
#define ACC float
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
    __global ACC* sa##i, __global ACC* sb##i, __global ACC* sc##i, __global ACC* mw##i, long n##i
#define STATE_ARGS __global T* p, __global const T* g, __global ACC* sa, __global ACC* sb, __global ACC* sc, \
    __global ACC* mw

/* the parameter's value (its master copy under MASTER) and the write of an updated one */
#ifdef MASTER
#define PARAM_READ(i) (mw[i])
#define PARAM_WRITE(i, v) { ACC v_ = (v); mw[i] = v_; STORE_T(p, i, v_); }
#else
#define PARAM_READ(i) LOAD_T(p, i)
#define PARAM_WRITE(i, v) STORE_T(p, i, (v))
#endif

#if OPT == OPT_SGD
#define HYPER_ARGS ACC lr, ACC momentum, ACC dampening, ACC weight_decay, int nesterov, int first_step
inline void update(STATE_ARGS, long i, long j, HYPER_ARGS) {
    ACC grad = LOAD_T(g, j);
    ACC param = PARAM_READ(i);
    if (weight_decay != (ACC)0) grad = grad + weight_decay * param;
    if (momentum != (ACC)0) {
        ACC buf = first_step ? grad : momentum * sa[i] + ((ACC)1 - dampening) * grad;
        sa[i] = buf;
        grad = nesterov ? grad + momentum * buf : buf;
    }
    PARAM_WRITE(i, param - lr * grad);
}
#define HYPER_PASS lr, momentum, dampening, weight_decay, nesterov, first_step

#elif OPT == OPT_ADAM
#define HYPER_ARGS ACC lr, ACC beta1, ACC beta2, ACC eps, ACC weight_decay, int decoupled, ACC bias_correction1, \
    ACC bias_correction2_sqrt, int amsgrad
inline void update(STATE_ARGS, long i, long j, HYPER_ARGS) {
    ACC grad = LOAD_T(g, j);
    ACC param = PARAM_READ(i);
    if (weight_decay != (ACC)0) {
        if (decoupled) param = param * ((ACC)1 - lr * weight_decay);
        else grad = grad + weight_decay * param;
    }
    ACC m = sa[i] + ((ACC)1 - beta1) * (grad - sa[i]);          /* exp_avg.lerp_(grad, 1 - beta1) */
    ACC v = beta2 * sb[i] + ((ACC)1 - beta2) * grad * grad;
    sa[i] = m;
    sb[i] = v;
    if (amsgrad) {   /* the largest exp_avg_sq so far (sc: max_exp_avg_sq) in the denominator */
        v = fmax(sc[i], v);
        sc[i] = v;
    }
    ACC denom = sqrt(v) / bias_correction2_sqrt + eps;
    PARAM_WRITE(i, param - (lr / bias_correction1) * (m / denom));
}
#define HYPER_PASS lr, beta1, beta2, eps, weight_decay, decoupled, bias_correction1, bias_correction2_sqrt, amsgrad

/* The same update over elements [j0, j1) of one tensor, LANES at a time (ITEMS > 1: CPUs, where
 * the per-element form runs as scalar code: sqrt and the division dominate). Same expressions per
 * lane as update(); the tail that does not fill the lanes goes through update(). Vectors stay at 32
 * bytes (float8, double4): PoCL 3.0 (LLVM 14) miscompiles or aborts on library calls (vloadn, sqrt)
 * with 512-bit vectors on AVX-512 CPUs it does not know (see gemm_cpu.cl). float32/float64 parameters
 * only: half ones take the per-element form (their loads convert). */
#if !defined(IS_HALF) && !defined(IS_BF16)
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
inline void update_range(STATE_ARGS, long j0, long j1, HYPER_ARGS) {
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
        if (amsgrad) {
            v = fmax(VLOAD(0, sc + j), v);
            VSTORE(v, 0, sc + j);
        }
        VT denom = sqrt(v) / bias_correction2_sqrt + eps;
        VSTORE(param - (lr / bias_correction1) * (m / denom), 0, p + j);
    }
    for (; j < j1; ++j) update(p, g, sa, sb, sc, mw, j, j, HYPER_PASS);
}
#endif

#elif OPT == OPT_RMSPROP
#define HYPER_ARGS ACC lr, ACC alpha, ACC eps, ACC weight_decay, ACC momentum, int centered
inline void update(STATE_ARGS, long i, long j, HYPER_ARGS) {
    ACC grad = LOAD_T(g, j);
    ACC param = PARAM_READ(i);
    if (weight_decay != (ACC)0) grad = grad + weight_decay * param;
    ACC sq = alpha * sa[i] + ((ACC)1 - alpha) * grad * grad;
    sa[i] = sq;
    ACC avg;
    if (centered) {
        ACC ga = sb[i] + ((ACC)1 - alpha) * (grad - sb[i]);      /* grad_avg.lerp_(grad, 1 - alpha) */
        sb[i] = ga;
        avg = sqrt(sq - ga * ga) + eps;
    } else {
        avg = sqrt(sq) + eps;
    }
    if (momentum > (ACC)0) {
        ACC buf = momentum * sc[i] + grad / avg;
        sc[i] = buf;
        PARAM_WRITE(i, param - lr * buf);
    } else {
        PARAM_WRITE(i, param - lr * (grad / avg));
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
        update_range(p##i + po##i, g##i + go##i, sa##i, sb##i, sc##i, mw##i, k * ITEMS, \
                     min((k + 1) * ITEMS, n##i), HYPER_PASS); \
        return; } \
    k -= chunks; }
#else
#define TRY(i) { long chunks = (n##i + ITEMS - 1) / ITEMS; \
    if (k < chunks) { \
        long end = min((k + 1) * ITEMS, n##i); \
        for (long j = k * ITEMS; j < end; ++j) \
            update(p##i + po##i, g##i + go##i, sa##i, sb##i, sc##i, mw##i, j, j, HYPER_PASS); \
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
#ifdef FOUND_INF
    , __global const int* found_inf
#endif
    , HYPER_ARGS)
{
    long k = get_global_id(0);
#ifdef FOUND_INF
    if (found_inf[0]) return;
#endif
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
 * Up to N_TENSORS gradients a launch (GRAD_ARGS(i): buffer, offset, length), so a model's clipping is a few
 * launches whatever its parameter count, each spread over the device:
 * sum_squares: work-group g sums x^2 (in ACC: float32 for half gradients) over chunk g of SQ_CHUNK elements,
 *   chunks of the launch's gradients laid end to end, into partial[first + g] (a fixed-order tree).
 * clip_coef: one work-group of WG adds partial[0..count) (fixed order: strided, then a tree), writes
 *   norm[0] = sqrt(sum) and norm[1] = min(1, max_norm / (norm + 1e-6)).
 * scale_by: x *= norm[1], ITEMS consecutive elements a work-item over the launch's gradients.
 * Every split is a function of the gradients' sizes only, so the norm has the same bits on every run.
 */
#ifndef WG
#define WG 256
#endif
#ifndef SQ_CHUNK
#define SQ_CHUNK 16384
#endif

#define GRAD_ARGS(i) __global T* x##i, long xo##i, long n##i
// M(i) for each of the launch's N_TENSORS gradients; the kernels' argument lists of A(i), comma-separated
#if N_TENSORS > 1
#define EACH_1(M) M(1)
#define LIST_1(A) , A(1)
#else
#define EACH_1(M)
#define LIST_1(A)
#endif
#if N_TENSORS > 2
#define EACH_2(M) M(2)
#define LIST_2(A) , A(2)
#else
#define EACH_2(M)
#define LIST_2(A)
#endif
#if N_TENSORS > 3
#define EACH_3(M) M(3)
#define LIST_3(A) , A(3)
#else
#define EACH_3(M)
#define LIST_3(A)
#endif
#if N_TENSORS > 4
#define EACH_4(M) M(4)
#define LIST_4(A) , A(4)
#else
#define EACH_4(M)
#define LIST_4(A)
#endif
#if N_TENSORS > 5
#define EACH_5(M) M(5)
#define LIST_5(A) , A(5)
#else
#define EACH_5(M)
#define LIST_5(A)
#endif
#if N_TENSORS > 6
#define EACH_6(M) M(6)
#define LIST_6(A) , A(6)
#else
#define EACH_6(M)
#define LIST_6(A)
#endif
#if N_TENSORS > 7
#define EACH_7(M) M(7)
#define LIST_7(A) , A(7)
#else
#define EACH_7(M)
#define LIST_7(A)
#endif
#define EACH_GRAD(M) M(0) EACH_1(M) EACH_2(M) EACH_3(M) EACH_4(M) EACH_5(M) EACH_6(M) EACH_7(M)
#define GRAD_LIST GRAD_ARGS(0) LIST_1(GRAD_ARGS) LIST_2(GRAD_ARGS) LIST_3(GRAD_ARGS) LIST_4(GRAD_ARGS) \
    LIST_5(GRAD_ARGS) LIST_6(GRAD_ARGS) LIST_7(GRAD_ARGS)

// the work-group's chunk: gradient i when k falls among its chunks (the same for all of a work-group)
#define SQ_FIND(i) if (!found) { \
    const long chunks = (n##i + SQ_CHUNK - 1) / SQ_CHUNK; \
    if (k < chunks) { \
        x = x##i; xo = xo##i; start = k * SQ_CHUNK; end = min(start + SQ_CHUNK, n##i); found = 1; } \
    else k -= chunks; }

__kernel void sum_squares(GRAD_LIST, __global ACC* partial, long first) {
    __local ACC acc[WG];
    const int lid = get_local_id(0);
    const long slot = first + get_group_id(0);
    long k = get_group_id(0), xo = 0, start = 0, end = 0;
    __global T* x = x0;
    int found = 0;
    EACH_GRAD(SQ_FIND)
    ACC s = (ACC)0;
    for (long i = start + lid; i < end; i += WG) { ACC v = LOAD_T(x, xo + i); s += v * v; }
    acc[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) acc[lid] += acc[lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) partial[slot] = acc[0];
}

__kernel void clip_coef(__global const ACC* partial, int count, ACC max_norm, __global ACC* norm) {
    __local ACC acc[WG];
    const int lid = get_local_id(0);
    ACC s = (ACC)0;
    for (int i = lid; i < count; i += WG) s += partial[i];
    acc[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) acc[lid] += acc[lid + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        ACC total = sqrt(acc[0]);
        norm[0] = total;
        ACC coef = max_norm / (total + (ACC)1e-6);
        norm[1] = coef < (ACC)1 ? coef : (ACC)1;
    }
}

#define SCALE_TRY(i) { long chunks = (n##i + ITEMS - 1) / ITEMS; \
    if (k < chunks) { \
        long end = min((k + 1) * ITEMS, n##i); \
        for (long j = k * ITEMS; j < end; ++j) STORE_T(x##i, xo##i + j, LOAD_T(x##i, xo##i + j) * c); \
        return; } \
    k -= chunks; }

__kernel void scale_by(GRAD_LIST, __global const ACC* norm) {
    long k = get_global_id(0);
    const ACC c = norm[1];
    EACH_GRAD(SCALE_TRY)
}

/* ---- dynamic loss scaling (netcl.amp.GradScaler) ---------------------------------------------
 * unscale_grads: x *= 1 / scale[0] over up to N_TENSORS gradients (GRAD_ARGS(i): buffer, offset,
 *   length), ITEMS consecutive elements per work-item laid end to end as optimizer_step's; any result
 *   that is not finite sets found_inf[0] = 1 (atomic_or: many may find one). The multiply is exact for a
 *   power-of-two scale; the check runs on the unscaled value in ACC, before rounding to T.
 * update_scale: one work-item, torch's _amp_update_scale_: on found_inf the scale is multiplied by
 *   backoff_factor and growth_tracker reset, else growth_tracker counts up and, at growth_interval,
 *   the scale is multiplied by growth_factor (kept finite) and the tracker reset.
 */
#define UNSCALE_TRY(i) { long chunks = (n##i + ITEMS - 1) / ITEMS; \
    if (k < chunks) { \
        long end = min((k + 1) * ITEMS, n##i); \
        int bad = 0; \
        for (long j = k * ITEMS; j < end; ++j) { \
            ACC v = LOAD_T(x##i, xo##i + j) * inv; \
            bad |= !isfinite(v); \
            STORE_T(x##i, xo##i + j, v); } \
        if (bad) atomic_or(found_inf, 1); \
        return; } \
    k -= chunks; }

__kernel void unscale_grads(GRAD_LIST, __global const float* scale, __global int* found_inf)
{
    long k = get_global_id(0);
    const ACC inv = (ACC)1 / (ACC)scale[0];
    EACH_GRAD(UNSCALE_TRY)
}

__kernel void update_scale(__global float* scale, __global int* growth_tracker, __global const int* found_inf,
                           float growth_factor, float backoff_factor, int growth_interval) {
    if (get_global_id(0) != 0) return;
    if (found_inf[0]) {
        scale[0] = scale[0] * backoff_factor;
        growth_tracker[0] = 0;
    } else {
        int grown = growth_tracker[0] + 1;
        if (grown >= growth_interval) {
            float next = scale[0] * growth_factor;
            if (isfinite(next)) scale[0] = next;
            grown = 0;
        }
        growth_tracker[0] = grown;
    }
}
