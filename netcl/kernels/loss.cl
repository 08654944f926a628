/* Fused losses: each loss is ONE launch forward (loss values and the mean/sum in the same
 * kernel) and ONE launch backward.
 *
 * Class losses (cross-entropy = log-softmax + NLL fused, and NLL on log-probabilities), for
 * x of shape (rows, classes) contiguous and integer labels (rows,):
 *   class_loss_rows      one work-group of ROW_WG work-items per row (global = rows x ROW_WG; 1 on CPUs,
 *                        where a work-item per row spreads the rows over the cores): the row max m
 *                        and log s, s = sum exp(x - m), each a fixed-order tree over the work-items'
 *                        strided partials (kept in stats[2 row], stats[2 row + 1] for backward), and
 *                        the row's loss log s - (x[label] - m) into row_loss (and out, for
 *                        REDUCE_NONE), 1 or 0 into row_count. Reads x twice (max, exp-sum), coalesced.
 *   class_loss_total     one work-group (global = local = WG): a fixed-order tree adds the row losses
 *                        and counted rows, so the result is reproducible; out and count.
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
 *   T, ACC (common.cl): the storage of the inputs and their gradients (float, double, half, bfloat16:
 *              read and written through LOAD_T/STORE_T) and the arithmetic type (float, or double with
 *              USE_FP64), which is also the type of out, stats, count and grad_out: a float16 or
 *              bfloat16 input gives a float32 loss (mixed precision: the loss is computed in float32).
 *   LABEL (int|long), WG (work-group size, power of two), ROW_WG (class_loss_rows' work-group size, a
 *              power of two).
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
#ifndef ROW_WG
#define ROW_WG WG
#endif

/* Sums two per-work-item values over the work-group in a fixed order; result in a[0], b[0]. */
inline void tree_sum2(__local ACC* a, __local ACC* b, int lid) {
    for (int stride = WG / 2; stride > 0; stride >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < stride) { a[lid] += a[lid + stride]; b[lid] += b[lid + stride]; }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

#include "checks.cl"

__kernel void class_loss_rows(
    __global const T* x, long x_off, long rows, long classes,
    __global const LABEL* labels, long lab_off, long ignore_index, ACC smoothing,
    __global ACC* out, __global ACC* stats, __global ACC* row_loss, __global ACC* row_count,
    __global int* err, int err_code)
{
    __local ACC pa[ROW_WG];
    __local ACC pb[ROW_WG];
    const int lid = get_local_id(0);
    const long r = get_group_id(0);
    if (r >= rows) return;  /* the whole work-group */
    __global const T* row = x + x_off + r * classes;
    const long label = (long)labels[lab_off + r];
    ACC row_loss_v = (ACC)0, m = (ACC)0, log_s = (ACC)0, counted = (ACC)0;
    if (label != ignore_index) {  /* the same for the whole work-group */
        const bool valid = label >= 0 && label < classes;
        if (!valid && lid == 0) report_check(err, err_code, label, r, classes);
#if LOSS == LOSS_CROSS_ENTROPY
        ACC mx = -INFINITY;
        for (long c = lid; c < classes; c += ROW_WG) mx = fmax(mx, LOAD_T(row, c));
        pa[lid] = mx;
        for (int stride = ROW_WG / 2; stride > 0; stride >>= 1) {
            barrier(CLK_LOCAL_MEM_FENCE);
            if (lid < stride) pa[lid] = fmax(pa[lid], pa[lid + stride]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        m = pa[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        ACC s = (ACC)0, sxm = (ACC)0;
        for (long c = lid; c < classes; c += ROW_WG) { ACC v = LOAD_T(row, c) - m; s += exp(v); sxm += v; }
        pa[lid] = s;
        pb[lid] = sxm;
        for (int stride = ROW_WG / 2; stride > 0; stride >>= 1) {
            barrier(CLK_LOCAL_MEM_FENCE);
            if (lid < stride) { pa[lid] += pa[lid + stride]; pb[lid] += pb[lid + stride]; }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        log_s = log(pa[0]);
        if (valid) {
            ACC nll = log_s - (LOAD_T(row, label) - m);
            row_loss_v = ((ACC)1 - smoothing) * nll + smoothing * (log_s - pb[0] / (ACC)classes);
        } else {
            row_loss_v = NAN;
        }
#else
        row_loss_v = valid ? -LOAD_T(row, label) : NAN;
#endif
        counted = (ACC)1;
    }
    if (lid == 0) {
        stats[2 * r] = m;
        stats[2 * r + 1] = log_s;
        row_loss[r] = row_loss_v;
        row_count[r] = counted;
        if (REDUCTION == REDUCE_NONE) out[r] = row_loss_v;
    }
}

__kernel void class_loss_total(long rows, __global const ACC* row_loss, __global const ACC* row_count,
                               __global ACC* out, __global ACC* count)
{
    __local ACC part_loss[WG];
    __local ACC part_count[WG];
    const int lid = get_local_id(0);
    if (REDUCTION == REDUCE_NONE) {
        if (lid == 0) count[0] = (ACC)1;
        return;
    }
    ACC loss_sum = (ACC)0, counted = (ACC)0;
    for (long r = lid; r < rows; r += WG) { loss_sum += row_loss[r]; counted += row_count[r]; }
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
    __global const LABEL* labels, long lab_off, long ignore_index, ACC smoothing,
    __global const ACC* stats, __global const ACC* count, __global const ACC* grad_out, long grad_out_off,
    __global T* grad_x)
{
    long c = get_global_id(0);
    long r = get_global_id(1);
    if (c >= classes || r >= rows) return;
    long label = (long)labels[lab_off + r];
    long idx = r * classes + c;
    if (label == ignore_index) { STORE_T(grad_x, idx, (ACC)0); return; }
    ACC scale = REDUCTION == REDUCE_NONE ? grad_out[grad_out_off + r]
            : (REDUCTION == REDUCE_MEAN ? grad_out[grad_out_off] / count[0] : grad_out[grad_out_off]);
    ACC onehot = c == label ? (ACC)1 : (ACC)0;
#if LOSS == LOSS_CROSS_ENTROPY
    ACC p = exp((LOAD_T(x, x_off + idx) - stats[2 * r]) - stats[2 * r + 1]);
    ACC d = p - ((ACC)1 - smoothing) * onehot - smoothing / (ACC)classes;
#else
    ACC d = -onehot;
#endif
    STORE_T(grad_x, idx, scale * d);
}

inline ACC pointwise_value(ACC a, ACC b, ACC beta) {
#if LOSS == LOSS_MSE
    ACC d = a - b; return d * d;
#elif LOSS == LOSS_L1
    return fabs(a - b);
#elif LOSS == LOSS_SMOOTH_L1
    ACC d = fabs(a - b);
    return d < beta ? (ACC)0.5 * d * d / beta : d - (ACC)0.5 * beta;
#else
    /* max(a, 0) - a * b + log(1 + exp(-|a|)): stable for logits of any size */
    return fmax(a, (ACC)0) - a * b + log1p(exp(-fabs(a)));
#endif
}

/* d loss / d a (the target's gradient is its negative, except for LOSS_BCE_WITH_LOGITS where it is -a). */
inline ACC pointwise_grad(ACC a, ACC b, ACC beta) {
#if LOSS == LOSS_MSE
    return (ACC)2 * (a - b);
#elif LOSS == LOSS_L1
    ACC d = a - b; return d > (ACC)0 ? (ACC)1 : (d < (ACC)0 ? (ACC)-1 : (ACC)0);
#elif LOSS == LOSS_SMOOTH_L1
    ACC d = a - b;
    if (fabs(d) < beta) return d / beta;
    return d > (ACC)0 ? (ACC)1 : (d < (ACC)0 ? (ACC)-1 : (ACC)0);
#else
    return (ACC)1 / ((ACC)1 + exp(-a)) - b;
#endif
}

__kernel void pointwise_loss_forward(
    __global const T* a, long a_off, __global const T* b, long b_off, long n, ACC beta,
    __global ACC* out)
{
    __local ACC part[WG];
    __local ACC unused[WG];
    int lid = get_local_id(0);
    ACC s = (ACC)0;
    for (long i = lid; i < n; i += WG) {
        ACC v = pointwise_value(LOAD_T(a, a_off + i), LOAD_T(b, b_off + i), beta);
        if (REDUCTION == REDUCE_NONE) out[i] = v;
        s += v;
    }
    if (REDUCTION == REDUCE_NONE) return;
    part[lid] = s;
    unused[lid] = (ACC)0;
    tree_sum2(part, unused, lid);
    if (lid == 0) out[0] = REDUCTION == REDUCE_MEAN ? part[0] / (ACC)n : part[0];
}

__kernel void pointwise_loss_backward(
    __global const T* a, long a_off, __global const T* b, long b_off, long n, ACC beta,
    __global const ACC* grad_out, long grad_out_off, __global T* grad_a, __global T* grad_b)
{
    long i = get_global_id(0);
    if (i >= n) return;
    ACC scale = REDUCTION == REDUCE_NONE ? grad_out[grad_out_off + i]
            : (REDUCTION == REDUCE_MEAN ? grad_out[grad_out_off] / (ACC)n : grad_out[grad_out_off]);
    ACC av = LOAD_T(a, a_off + i), bv = LOAD_T(b, b_off + i);
    ACC d = scale * pointwise_grad(av, bv, beta);
    STORE_T(grad_a, i, d);
#ifdef HAS_GRAD_B
#if LOSS == LOSS_BCE_WITH_LOGITS
    STORE_T(grad_b, i, -scale * av);
#else
    STORE_T(grad_b, i, -d);
#endif
#endif
}
