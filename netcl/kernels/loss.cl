/* Fused losses: each loss is ONE launch forward (loss values and the mean/sum in the same
 * kernel) and ONE launch backward.
 *
 * Class losses (cross-entropy = log-softmax + NLL fused, and NLL on log-probabilities), for
 * x of shape (rows, classes) contiguous and integer labels (rows,):
 *   class_loss_forward   one work-group of WG work-items (global = local = WG). Work-item l
 *                        takes rows l, l+WG, ...: the row max m and log s, s = sum exp(x - m)
 *                        (kept in stats[2 row], stats[2 row + 1] for backward), the row's loss
 *                        log s - (x[label] - m); then a fixed-order tree in local memory adds the
 *                        losses and the counted rows, so the result is reproducible. Reads x once
 *                        per pass (3 passes over a row: max, exp-sum, label).
 *   class_loss_backward  2-D global (classes, rows), one work-item per element of grad_x:
 *                        d = softmax - (1 - eps) * onehot - eps / C, softmax = exp((x - m) - log s),
 *                        scaled by the incoming gradient (divided by the counted rows for the
 *                        mean). Reads x, stats.
 * m and log s stay apart: with logits of large magnitude, lse = m + log s rounds to the ulp of m
 * (6e-5 at 1000), and exp(x - lse) carried that error into every probability; x - m is exact.
 * Pointwise losses (LOSS_MSE, LOSS_L1, LOSS_SMOOTH_L1, LOSS_BCE_WITH_LOGITS: binary cross-entropy with
 * logits) of input a and target b, same shape, contiguous:
 *   pointwise_loss_forward   one work-group, strided loop then tree (as above); REDUCE_NONE writes
 *                            the n values instead.
 *   pointwise_loss_backward  1-D, one work-item per element: grad_a and (HAS_GRAD_B) grad_b.
 * Ignored rows (label == ignore_index) give loss 0 and gradient 0 and are not counted. A label outside
 * [0, classes) makes the loss NaN and is reported in the queue's check record `err` under `err_code`
 * (the host raises it at the next read).
 *
 * Defines, by name (netcl.ops.loss passes the names below, never their values):
 *   LOSS       LOSS_CROSS_ENTROPY | LOSS_NLL (class kernels), LOSS_MSE | LOSS_L1 | LOSS_SMOOTH_L1 |
 *              LOSS_BCE_WITH_LOGITS (pointwise kernels)
 *   REDUCTION  REDUCE_NONE | REDUCE_MEAN | REDUCE_SUM
 *   T (float|double; USE_FP64), LABEL (int|long), WG (work-group size, power of two).
 */
#include "common.cl"
#define LOSS_CROSS_ENTROPY 1
#define LOSS_NLL 2
#define LOSS_MSE 3
#define LOSS_L1 4
#define LOSS_SMOOTH_L1 5
#define LOSS_BCE_WITH_LOGITS 6
#define REDUCE_NONE 0
#define REDUCE_MEAN 1
#define REDUCE_SUM 2
#ifndef LABEL
#define LABEL int  /* the pointwise programs compile the class kernels too */
#endif

/* Sums two per-work-item values over the work-group in a fixed order; result in a[0], b[0]. */
inline void tree_sum2(__local T* a, __local T* b, int lid) {
    for (int stride = WG / 2; stride > 0; stride >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < stride) { a[lid] += a[lid + stride]; b[lid] += b[lid + stride]; }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

#include "checks.cl"

__kernel void class_loss_forward(
    __global const T* x, long x_off, long rows, long classes,
    __global const LABEL* labels, long lab_off, long ignore_index, T smoothing,
    __global T* out, __global T* stats, __global T* count, __global int* err, int err_code)
{
    __local T part_loss[WG];
    __local T part_count[WG];
    int lid = get_local_id(0);
    T loss_sum = (T)0, counted = (T)0;
    for (long r = lid; r < rows; r += WG) {
        __global const T* row = x + x_off + r * classes;
        long label = (long)labels[lab_off + r];
        T row_loss = (T)0;
        T m = (T)0, log_s = (T)0;
        if (label != ignore_index) {
            const bool valid = label >= 0 && label < classes;
            if (!valid) report_check(err, err_code, label, r, classes);
#if LOSS == LOSS_CROSS_ENTROPY
            m = row[0];
            for (long c = 1; c < classes; ++c) m = fmax(m, row[c]);
            T s = (T)0, sxm = (T)0;
            for (long c = 0; c < classes; ++c) { s += exp(row[c] - m); sxm += row[c] - m; }
            log_s = log(s);
            if (valid) {
                T nll = log_s - (row[label] - m);
                row_loss = ((T)1 - smoothing) * nll + smoothing * (log_s - sxm / (T)classes);
            } else {
                row_loss = NAN;
            }
#else
            row_loss = valid ? -row[label] : NAN;
#endif
            counted += (T)1;
        }
        stats[2 * r] = m;
        stats[2 * r + 1] = log_s;
        if (REDUCTION == REDUCE_NONE) out[r] = row_loss;
        loss_sum += row_loss;
    }
    if (REDUCTION == REDUCE_NONE) {
        if (lid == 0) count[0] = (T)1;
        return;
    }
    part_loss[lid] = loss_sum;
    part_count[lid] = counted;
    tree_sum2(part_loss, part_count, lid);
    if (lid == 0) {
        count[0] = part_count[0];
        out[0] = REDUCTION == REDUCE_MEAN ? part_loss[0] / part_count[0] : part_loss[0];
    }
}

__kernel void class_loss_backward(
    __global const T* x, long x_off, long rows, long classes,
    __global const LABEL* labels, long lab_off, long ignore_index, T smoothing,
    __global const T* stats, __global const T* count, __global const T* grad_out, long grad_out_off,
    __global T* grad_x)
{
    long c = get_global_id(0);
    long r = get_global_id(1);
    if (c >= classes || r >= rows) return;
    long label = (long)labels[lab_off + r];
    long idx = r * classes + c;
    if (label == ignore_index) { grad_x[idx] = (T)0; return; }
    T scale = REDUCTION == REDUCE_NONE ? grad_out[grad_out_off + r]
            : (REDUCTION == REDUCE_MEAN ? grad_out[grad_out_off] / count[0] : grad_out[grad_out_off]);
    T onehot = c == label ? (T)1 : (T)0;
#if LOSS == LOSS_CROSS_ENTROPY
    T p = exp((x[x_off + idx] - stats[2 * r]) - stats[2 * r + 1]);
    T d = p - ((T)1 - smoothing) * onehot - smoothing / (T)classes;
#else
    T d = -onehot;
#endif
    grad_x[idx] = scale * d;
}

inline T pointwise_value(T a, T b, T beta) {
#if LOSS == LOSS_MSE
    T d = a - b; return d * d;
#elif LOSS == LOSS_L1
    return fabs(a - b);
#elif LOSS == LOSS_SMOOTH_L1
    T d = fabs(a - b);
    return d < beta ? (T)0.5 * d * d / beta : d - (T)0.5 * beta;
#else
    /* max(a, 0) - a * b + log(1 + exp(-|a|)): stable for logits of any size */
    return fmax(a, (T)0) - a * b + log1p(exp(-fabs(a)));
#endif
}

/* d loss / d a (the target's gradient is its negative, except for LOSS_BCE_WITH_LOGITS where it is -a). */
inline T pointwise_grad(T a, T b, T beta) {
#if LOSS == LOSS_MSE
    return (T)2 * (a - b);
#elif LOSS == LOSS_L1
    T d = a - b; return d > (T)0 ? (T)1 : (d < (T)0 ? (T)-1 : (T)0);
#elif LOSS == LOSS_SMOOTH_L1
    T d = a - b;
    if (fabs(d) < beta) return d / beta;
    return d > (T)0 ? (T)1 : (d < (T)0 ? (T)-1 : (T)0);
#else
    return (T)1 / ((T)1 + exp(-a)) - b;
#endif
}

__kernel void pointwise_loss_forward(
    __global const T* a, long a_off, __global const T* b, long b_off, long n, T beta,
    __global T* out)
{
    __local T part[WG];
    __local T unused[WG];
    int lid = get_local_id(0);
    T s = (T)0;
    for (long i = lid; i < n; i += WG) {
        T v = pointwise_value(a[a_off + i], b[b_off + i], beta);
        if (REDUCTION == REDUCE_NONE) out[i] = v;
        s += v;
    }
    if (REDUCTION == REDUCE_NONE) return;
    part[lid] = s;
    unused[lid] = (T)0;
    tree_sum2(part, unused, lid);
    if (lid == 0) out[0] = REDUCTION == REDUCE_MEAN ? part[0] / (T)n : part[0];
}

__kernel void pointwise_loss_backward(
    __global const T* a, long a_off, __global const T* b, long b_off, long n, T beta,
    __global const T* grad_out, long grad_out_off, __global T* grad_a, __global T* grad_b)
{
    long i = get_global_id(0);
    if (i >= n) return;
    T scale = REDUCTION == REDUCE_NONE ? grad_out[grad_out_off + i]
            : (REDUCTION == REDUCE_MEAN ? grad_out[grad_out_off] / (T)n : grad_out[grad_out_off]);
    T av = a[a_off + i], bv = b[b_off + i];
    T d = scale * pointwise_grad(av, bv, beta);
    grad_a[i] = d;
#ifdef HAS_GRAD_B
#if LOSS == LOSS_BCE_WITH_LOGITS
    grad_b[i] = -scale * av;
#else
    grad_b[i] = -d;
#endif
#endif
}
