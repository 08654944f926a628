// BatchNorm over (N, C, HW) per channel c: the statistics and the backward's two sums in one pass over
// memory each, then one elementwise pass each way (batch_norm_apply, batch_norm_grad_input) on the
// per-channel vectors the reductions wrote.
//
// Forward statistics: the channel's M = N*HW values are split into S parts. Each part keeps Welford's
// (count, mean, M2): a work-item folds in its values (a batch of VEC at a time: the batch's own mean and
// M2, then Chan's merge), then parts merge the same way (local-memory tree, then the finalize kernel).
// Exact to rounding whatever the mean (no sum-of-squares cancellation), one read of x.
//   batch_norm_stats_groups (GPUs): global (C*S*LOCAL), local (LOCAL); work-group (c, s) walks its part
//     in VEC-wide loads along the flat index j = n*HW + i (HW is a define: no runtime div/mod),
//     coalesced across the work-group; a tree merges the work-items.
//   batch_norm_stats_runs (CPUs): global (C*S), work-group size 1; work-item (c, s) takes images
//     n = s, s + S, ... : for each it sums the HW-long run with 8 accumulators, then the run's squared
//     deviations (the run is in L1), then merges (count HW) into its state. No barriers.
//   With S == 1 the part is the channel: it writes the results itself (finish_stats); else it writes its
//   (count, mean, M2) to part[(c*S + s)*3 ..] and batch_norm_finalize (global (C)) merges the S parts,
//   or (_groups with LAST=1) the channel's last work-group to finish merges them itself (nc_last_arrival: a
//   per-channel counter, incremented after the partials are written and reset by that last group), in
//   the fixed order s = 0..S-1, so the results do not depend on which group finished last.
// Results (finish_stats) into stats (4, C): mean, invstd = rsqrt(var + eps) (biased var), scale =
//   weight * invstd, beta = bias (0 without); running stats, when given, get momentum updates with the
//   unbiased variance (PyTorch's rule). batch_norm_finalize with training = 0 fills stats from the
//   running statistics instead (eval).
//
// Backward: with g' = grad_y (masked by y > 0 when the forward fused a relu; y recomputed from x),
// sums sg = sum g' and sgxm = sum g' (x - mean) per channel in one pass over grad_y and x, split and
// merged like the forward (batch_norm_backward_groups / _runs, batch_norm_backward_finalize). Results
// (finish_backward): grad_weight = sgxm * invstd, grad_bias = sg, and coef for the JIT's
//   grad_x = (g' - mg) * k - (x - mean) * d,  g' = where((x - mean) * k + beta > 0, g, 0) under relu
// with k = weight * invstd (y's scale too), mg = sg / M, d = k * invstd^2 * sgxm / M (training; 0 in
// eval, where the statistics are constants): coef (5, C) rows k, mg, mean, d, beta.
// Elementwise passes: batch_norm_apply y = act((x - mean) * scale + beta) from stats;
// batch_norm_grad_input grad_x from coef (the formula above). Layouts: _flat (GPUs): global
// (HW/VEC, N*C), one VEC-wide load per work-item (coalesced along HW); _runs (CPUs): global (N*C),
// one work-item per (n, c) run of HW values (a unit-stride loop PoCL vectorises).
// (The JIT could write these passes, but its elementwise kernels index a (1, C, 1, 1) broadcast
// operand with a div/mod per dimension and element: 7x a plain add on PoCL, bench/NOTES.md.)
// Memory: forward reads x twice and writes y; backward reads grad_y and x twice and writes grad_x.
// Partials: 3 (2 backward) ACC values per (c, s).

#include "common.cl"

#ifndef T
#define T float
#endif
#ifndef ACC
#define ACC float
#endif
#ifndef LOCAL
#define LOCAL 1            // work-group size of the _groups kernels, a power of two
#endif
#ifndef HW
#define HW 1               // spatial size per (n, c): a define so the _groups kernels divide by a constant
#endif
#ifndef VEC
#define VEC 1              // 4: HW % 4 == 0 and x (and grad_y) start on a 4-element boundary
#endif
#ifndef UNR
#define UNR 1              // _groups with VEC == 4: float4 loads a work-item issues at once (the statistics
                           // then fold them in as one batch of 4 * UNR values: one Welford merge)
#endif
#ifndef LAST
#define LAST 0             // 1: the _groups kernels merge the S parts in their last work-group (no finalize)
#endif
#if LAST && defined(USE_FP64)
#error "norm_batch.cl: LAST=1 needs float accumulators (its partials move through 32-bit atomics)"
#endif
// ACT (common.cl): ACT_RELU when the forward fused a relu (backward masks grad_y by y > 0)

#define LD(p, i) ((ACC)(p)[i])
// float16/bfloat16 storage: x, y and their gradients are T, read by XL (common.cl's LOAD_T) and 4 at a
// time by XLOAD4 (vloada_half4 / ushort4), written by XSTORE4 / STORE_T; the per-channel vectors (weight,
// bias, running statistics, stats, coef, parameter gradients) are PT = float, read by LD.
#define XL(p, i) LOAD_T(p, i)
#if defined(IS_HALF) || defined(IS_BF16)
#define PT float
#define XV4 float4
#define XS float
#else
#define PT T
#define XV4 VT(4)
#define XS T
#endif
#if defined(IS_HALF)
#define XLOAD4(p, at) vloada_half4((at), (p))
#define XSTORE4(p, at, v) vstorea_half4((v), (at), (p))
#elif defined(IS_BF16)
#define XLOAD4(p, at) as_float4(convert_uint4(vload4((at), (p))) << 16)
#define XSTORE4(p, at, v) vstore4((ushort4)(nc_float_to_bf16((v).x), nc_float_to_bf16((v).y), \
                                            nc_float_to_bf16((v).z), nc_float_to_bf16((v).w)), (at), (p))
#else
#define XLOAD4(p, at) (*((__global const VT(4) *)(p) + (at)))
#define XSTORE4(p, at, v) (*((__global VT(4) *)(p) + (at)) = (v))
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VT(n) CAT(T, n)

// The per-channel results an elementwise part of the same launch reads (the chains below: LAST, float
// accumulators) are stored through PART_STORE and read through CHAIN_LOAD: atomics (not a data race) but on
// NVIDIA, where they are a plain store and a load from L2 (never an L1 line read before the channel was
// ready: channels share lines; common.cl's nc_part_load).
#if LAST
#define RESULT_STORE(p, i, v) PART_STORE(p, i, v)
#else
#define RESULT_STORE(p, i, v) ((p)[i] = (PT)(v))
#endif
#define CHAIN_LOAD(p, i) ((ACC)PART_LOAD(p, i))

// Chan et al.'s merge of (na, ma, m2a) with (nb, mb, m2b) into the first.
inline void welford_merge(ACC *na, ACC *ma, ACC *m2a, const ACC nb, const ACC mb, const ACC m2b)
{
    const ACC n = *na + nb;
    if (nb == (ACC)0) return;
    const ACC delta = mb - *ma, f = nb / n;
    *ma += delta * f;
    *m2a += m2b + delta * delta * *na * f;
    *na = n;
}

inline void finish_stats(const int c, const int C, const ACC n, const ACC mean, const ACC m2,
                         __global const PT *w, const long w_off, __global const PT *b, const long b_off,
                         const int has_w, const int has_b, __global PT *rmean, __global PT *rvar,
                         const int has_running, __global PT *stats, const ACC momentum, const ACC eps)
{
    const ACC var = m2 / n, invstd = rsqrt(var + eps);
    RESULT_STORE(stats, c, mean);
    RESULT_STORE(stats, C + c, invstd);
    RESULT_STORE(stats, 2 * C + c, has_w ? LD(w, w_off + c) * invstd : invstd);
    RESULT_STORE(stats, 3 * C + c, has_b ? LD(b, b_off + c) : (ACC)0);
    if (has_running) {
        const ACC unbiased = n > (ACC)1 ? m2 / (n - (ACC)1) : var;
        rmean[c] = (PT)(((ACC)1 - momentum) * LD(rmean, c) + momentum * mean);
        rvar[c] = (PT)(((ACC)1 - momentum) * LD(rvar, c) + momentum * unbiased);
    }
}

#define STATS_ARGS                                                                                   \
    __global const T *x, const long x_off, __global const PT *w, const long w_off, __global const PT *b, \
    const long b_off, const int has_w, const int has_b, __global PT *rmean, __global PT *rvar,        \
    const int has_running, __global ACC *part, __global PT *stats, const int N, const int C, const int S, \
    const ACC momentum, const ACC eps
#define STATS_PASS w, w_off, b, b_off, has_w, has_b, rmean, rvar, has_running, stats, momentum, eps

// With LAST the channel's last part to finish merges the S parts (nc_last_arrival, PART_STORE and PART_LOAD
// of common.cl: count[c] per channel) instead of a finalize launch.

// Welford's (count, mean, M2) of part s of channel c (the channel's N * HW / VEC loads split into S parts),
// merged over the work-group: valid in work-item 0. Every work-item calls it (its barriers); a part with
// start == end (the chain's apply work-groups) folds nothing in.
inline void stats_part(const int c, const long start, const long end, __global const T *x, const long x_off,
                       const int C, ACC *pn, ACC *pmean, ACC *pm2, __local ACC *sn, __local ACC *sm,
                       __local ACC *sq)
{
    const int lid = get_local_id(0);
    ACC n = (ACC)0, mean = (ACC)0, m2 = (ACC)0;
#if VEC == 4
    // UNR loads in flight per work-item (j, j + LOCAL, ...), then each float4 folds in as a batch of 4
    for (long j0 = start + lid; j0 < end; j0 += (long)LOCAL * UNR) {
        XV4 v4[UNR];
        for (int u = 0; u < UNR; ++u) {
            const long j = j0 + (long)u * LOCAL;
            const long img = j / (HW / VEC), i = j - img * (HW / VEC);
            if (j < end) v4[u] = XLOAD4(x + x_off, (img * C + c) * (HW / VEC) + i);
        }
        if (j0 + (long)(UNR - 1) * LOCAL < end) {   // all loaded: one batch of 4 * UNR values, one merge
            ACC sum = (ACC)0, bq = (ACC)0;
            for (int u = 0; u < UNR; ++u) sum += ((ACC)v4[u].x + (ACC)v4[u].y) + ((ACC)v4[u].z + (ACC)v4[u].w);
            const ACC bm = sum * (ACC)(1.0 / (4 * UNR));
            for (int u = 0; u < UNR; ++u) {
                const ACC d0 = (ACC)v4[u].x - bm, d1 = (ACC)v4[u].y - bm, d2 = (ACC)v4[u].z - bm;
                const ACC d3 = (ACC)v4[u].w - bm;
                bq += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
            }
            welford_merge(&n, &mean, &m2, (ACC)(4 * UNR), bm, bq);
            continue;
        }
        for (int u = 0; u < UNR; ++u) {   // the part's tail: float4 by float4
            if (j0 + (long)u * LOCAL >= end) break;
            const ACC v0 = v4[u].x, v1 = v4[u].y, v2 = v4[u].z, v3 = v4[u].w;
            const ACC bm = (v0 + v1 + v2 + v3) * (ACC)0.25;
            const ACC bq = (v0 - bm) * (v0 - bm) + (v1 - bm) * (v1 - bm) + (v2 - bm) * (v2 - bm) + (v3 - bm) * (v3 - bm);
            welford_merge(&n, &mean, &m2, (ACC)4, bm, bq);
        }
    }
#else
    for (long j = start + lid; j < end; j += LOCAL) {
        const long img = j / (HW / VEC), i = j - img * (HW / VEC);
        const long at = (img * C + c) * (HW / VEC) + i;
        welford_merge(&n, &mean, &m2, (ACC)1, XL(x, x_off + at), (ACC)0);
    }
#endif
#if LOCAL > 1
    sn[lid] = n;
    sm[lid] = mean;
    sq[lid] = m2;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LOCAL / 2; h > 0; h >>= 1) {
        if (lid < h) {
            ACC na = sn[lid], ma = sm[lid], qa = sq[lid];
            welford_merge(&na, &ma, &qa, sn[lid + h], sm[lid + h], sq[lid + h]);
            sn[lid] = na;
            sm[lid] = ma;
            sq[lid] = qa;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    n = sn[0];
    mean = sm[0];
    m2 = sq[0];
#endif
    *pn = n;
    *pmean = mean;
    *pm2 = m2;
}

#if LAST
// Work-item 0 of part s: its partials stored, and true for the channel's last part to arrive, which then
// merged the S parts in the fixed order s = 0..S-1 and wrote the statistics (finish_stats).
inline int stats_arrive(const int c, const int s, const ACC n, const ACC mean, const ACC m2, __global ACC *part,
                        __global int *count, const int C, const int S, __global const PT *w, const long w_off,
                        __global const PT *b, const long b_off, const int has_w, const int has_b,
                        __global PT *rmean, __global PT *rvar, const int has_running, __global PT *stats,
                        const ACC momentum, const ACC eps)
{
    __global ACC *o = part + ((long)c * S + s) * 3;
    PART_STORE(o, 0, n);
    PART_STORE(o, 1, mean);
    PART_STORE(o, 2, m2);
    if (!nc_last_arrival(count + c, S)) return 0;
    __global ACC *pc = part + (long)c * S * 3;
    ACC mn = (ACC)0, mm = (ACC)0, mq = (ACC)0;
    for (int t = 0; t < S; ++t)
        welford_merge(&mn, &mm, &mq, PART_LOAD(pc, 3 * t), PART_LOAD(pc, 3 * t + 1), PART_LOAD(pc, 3 * t + 2));
    finish_stats(c, C, mn, mm, mq, STATS_PASS);
    return 1;
}
#endif

// the part's loads [start, end) of the channel's N * (HW / VEC)
#define PART_RANGE(s)                                                                                \
    const long total = (long)N * (HW / VEC);                                                         \
    const long per = (total + S - 1) / S, start = (s) * per, end = min(total, start + per)

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void batch_norm_stats_groups(STATS_ARGS, __global int *count)
{
    __local ACC sn[LOCAL], sm[LOCAL], sq[LOCAL];
    const int grp = get_group_id(0), lid = get_local_id(0);
    const int c = grp / S, s = grp - (grp / S) * S;   // the grid is exactly C*S work-groups
    PART_RANGE(s);
    ACC n, mean, m2;
    stats_part(c, start, end, x, x_off, C, &n, &mean, &m2, sn, sm, sq);
    if (lid == 0) {   // no early return of the other work-items: PoCL hung on that beside barriers
        if (S == 1) {
            finish_stats(c, C, n, mean, m2, STATS_PASS);
        } else {
#if LAST
            stats_arrive(c, s, n, mean, m2, part, count, C, S, STATS_PASS);
#else
            __global ACC *o = part + ((long)c * S + s) * 3;
            o[0] = n;
            o[1] = mean;
            o[2] = m2;
#endif
        }
    }
}

// Sum of the n values at p with 8 independent accumulators (PoCL vectorises the 8 lanes).
inline ACC run_sum(const __global T *p, const int n)
{
    ACC a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) a[l] += XL(p, i + l);
    for (; i < n; ++i) a[0] += XL(p, i);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

__kernel void batch_norm_stats_runs(STATS_ARGS, const int hw)
{
    const int grp = get_global_id(0);
    const int c = grp / S, s = grp - (grp / S) * S;
    if (c >= C) return;
    ACC n = (ACC)0, mean = (ACC)0, m2 = (ACC)0;
    for (int img = s; img < N; img += S) {
        const __global T *p = x + x_off + ((long)img * C + c) * hw;
        const ACC rm = run_sum(p, hw) / (ACC)hw;
        ACC q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = 0;
        for (; i + 8 <= hw; i += 8)
            for (int l = 0; l < 8; ++l) {
                const ACC d = XL(p, i + l) - rm;
                q[l] += d * d;
            }
        for (; i < hw; ++i) {
            const ACC d = XL(p, i) - rm;
            q[0] += d * d;
        }
        const ACC rq = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
        welford_merge(&n, &mean, &m2, (ACC)hw, rm, rq);
    }
    if (S == 1) {
        finish_stats(c, C, n, mean, m2, STATS_PASS);
    } else {
        __global ACC *o = part + ((long)c * S + s) * 3;
        o[0] = n;
        o[1] = mean;
        o[2] = m2;
    }
}

// Merge the S parts of each channel (training), or take the running statistics (training = 0).
__kernel void batch_norm_finalize(__global const PT *w, const long w_off, __global const PT *b, const long b_off,
                                  const int has_w, const int has_b, __global PT *rmean, __global PT *rvar,
                                  const int has_running, __global const ACC *part, __global PT *stats,
                                  const int C, const int S, const int training, const ACC momentum, const ACC eps)
{
    const int c = get_global_id(0);
    if (c >= C) return;
    if (!training) {
        const ACC mean = LD(rmean, c), invstd = rsqrt(LD(rvar, c) + eps);
        stats[c] = (PT)mean;
        stats[C + c] = (PT)invstd;
        stats[2 * C + c] = (PT)(has_w ? LD(w, w_off + c) * invstd : invstd);
        stats[3 * C + c] = has_b ? b[b_off + c] : (PT)0;
        return;
    }
    ACC n = (ACC)0, mean = (ACC)0, m2 = (ACC)0;
    for (int s = 0; s < S; ++s) {
        const __global ACC *o = part + ((long)c * S + s) * 3;
        welford_merge(&n, &mean, &m2, o[0], o[1], o[2]);
    }
    finish_stats(c, C, n, mean, m2, STATS_PASS);
}

// -- backward ----------------------------------------------------------------------------------------

inline void finish_backward(const int c, const int C, const ACC M, const ACC sg, const ACC sgxm,
                            const ACC mean, const ACC invstd, const ACC wc, const ACC beta, const int training,
                            __global PT *gw, __global PT *gb, __global PT *coef)
{
    const ACC k = wc * invstd;
    gw[c] = (PT)(sgxm * invstd);
    gb[c] = (PT)sg;
    RESULT_STORE(coef, c, k);
    RESULT_STORE(coef, C + c, training ? sg / M : (ACC)0);
    RESULT_STORE(coef, 2 * C + c, mean);
    RESULT_STORE(coef, 3 * C + c, training ? k * invstd * invstd * sgxm / M : (ACC)0);
    RESULT_STORE(coef, 4 * C + c, beta);
}

#define BWD_ARGS                                                                                     \
    __global const T *gy, const long gy_off, __global const T *x, const long x_off,                   \
    __global const PT *w, const long w_off, __global const PT *b, const long b_off, const int has_w,  \
    const int has_b, __global const PT *mean_in, const long mean_off, __global const PT *invstd_in,   \
    const long invstd_off, __global ACC *part, __global PT *gw, __global PT *gb, __global PT *coef,   \
    const int N, const int C, const int S, const int training

// The channel's constants: mean, invstd, weight, beta, and (relu) y's scale.
#define BWD_CONSTANTS                                                                                \
    const ACC mean = LD(mean_in, mean_off + c), invstd = LD(invstd_in, invstd_off + c);               \
    const ACC wc = has_w ? LD(w, w_off + c) : (ACC)1, beta = has_b ? LD(b, b_off + c) : (ACC)0;      \
    const ACC scale = wc * invstd;                                                                    \
    (void)scale

#if ACT == ACT_RELU
#define MASKED(g, xv) ((((xv) - mean) * scale + beta) > (ACC)0 ? (g) : (ACC)0)
#else
#define MASKED(g, xv) (g)
#endif

// The sums sg and sgxm of part [start, end) of channel c, over the work-group (valid in work-item 0); every
// work-item calls it (its barriers). mean, scale, beta: the channel's constants (MASKED).
inline void sums_part(const int c, const long start, const long end, __global const T *gy, const long gy_off,
                      __global const T *x, const long x_off, const int C, const ACC mean, const ACC scale,
                      const ACC beta, ACC *psg, ACC *psgxm, __local ACC *s1, __local ACC *s2)
{
    const int lid = get_local_id(0);
    ACC sg = (ACC)0, sgxm = (ACC)0;
#if VEC == 4
    for (long j0 = start + lid; j0 < end; j0 += (long)LOCAL * UNR) {   // UNR loads in flight, as the stats
        XV4 g4v[UNR], x4v[UNR];
        for (int u = 0; u < UNR; ++u) {
            const long j = j0 + (long)u * LOCAL;
            const long img = j / (HW / VEC), i = j - img * (HW / VEC);
            const long at = (img * C + c) * (HW / VEC) + i;
            if (j < end) {
                g4v[u] = XLOAD4(gy + gy_off, at);
                x4v[u] = XLOAD4(x + x_off, at);
            }
        }
        for (int u = 0; u < UNR; ++u) {
            if (j0 + (long)u * LOCAL >= end) break;
            const XV4 g4 = g4v[u], x4 = x4v[u];
            const ACC g0 = MASKED((ACC)g4.x, (ACC)x4.x), g1 = MASKED((ACC)g4.y, (ACC)x4.y);
            const ACC g2 = MASKED((ACC)g4.z, (ACC)x4.z), g3 = MASKED((ACC)g4.w, (ACC)x4.w);
            sg += (g0 + g1) + (g2 + g3);
            sgxm += (g0 * ((ACC)x4.x - mean) + g1 * ((ACC)x4.y - mean)) + (g2 * ((ACC)x4.z - mean) + g3 * ((ACC)x4.w - mean));
        }
    }
#else
    for (long j = start + lid; j < end; j += LOCAL) {
        const long img = j / (HW / VEC), i = j - img * (HW / VEC);
        const long at = (img * C + c) * (HW / VEC) + i;
        const ACC xv = XL(x, x_off + at), g = MASKED(XL(gy, gy_off + at), xv);
        sg += g;
        sgxm += g * (xv - mean);
    }
#endif
#if LOCAL > 1
    s1[lid] = sg;
    s2[lid] = sgxm;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = LOCAL / 2; h > 0; h >>= 1) {
        if (lid < h) {
            s1[lid] += s1[lid + h];
            s2[lid] += s2[lid + h];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    sg = s1[0];
    sgxm = s2[0];
#endif
    *psg = sg;
    *psgxm = sgxm;
}

#if LAST
// Work-item 0 of part s: its partial sums stored, and true for the channel's last part to arrive, which then
// added the S parts in the order s = 0..S-1 and wrote the results (finish_backward).
inline int backward_arrive(const int c, const int s, const ACC sg, const ACC sgxm, __global ACC *part,
                           __global int *count, const int N, const int C, const int S, const ACC mean,
                           const ACC invstd, const ACC wc, const ACC beta, const int training, __global PT *gw,
                           __global PT *gb, __global PT *coef)
{
    __global ACC *o = part + ((long)c * S + s) * 2;
    PART_STORE(o, 0, sg);
    PART_STORE(o, 1, sgxm);
    if (!nc_last_arrival(count + c, S)) return 0;
    __global ACC *pc = part + (long)c * S * 2;
    ACC tg = (ACC)0, tq = (ACC)0;
    for (int t = 0; t < S; ++t) {
        tg += PART_LOAD(pc, 2 * t);
        tq += PART_LOAD(pc, 2 * t + 1);
    }
    finish_backward(c, C, (ACC)N * HW, tg, tq, mean, invstd, wc, beta, training, gw, gb, coef);
    return 1;
}
#endif

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void batch_norm_backward_groups(BWD_ARGS, __global int *count)
{
    __local ACC s1[LOCAL], s2[LOCAL];
    const int grp = get_group_id(0), lid = get_local_id(0);
    const int c = grp / S, s = grp - (grp / S) * S;   // the grid is exactly C*S work-groups
    BWD_CONSTANTS;
    PART_RANGE(s);
    ACC sg, sgxm;
    sums_part(c, start, end, gy, gy_off, x, x_off, C, mean, scale, beta, &sg, &sgxm, s1, s2);
    if (lid == 0) {
        if (S == 1) {
            finish_backward(c, C, (ACC)N * HW, sg, sgxm, mean, invstd, wc, beta, training, gw, gb, coef);
        } else {
#if LAST
            backward_arrive(c, s, sg, sgxm, part, count, N, C, S, mean, invstd, wc, beta, training, gw, gb, coef);
#else
            __global ACC *o = part + ((long)c * S + s) * 2;
            o[0] = sg;
            o[1] = sgxm;
#endif
        }
    }
}

__kernel void batch_norm_backward_runs(BWD_ARGS, const int hw)
{
    const int grp = get_global_id(0);
    const int c = grp / S, s = grp - (grp / S) * S;
    if (c >= C) return;
    BWD_CONSTANTS;
    ACC a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int img = s; img < N; img += S) {
        const long base = ((long)img * C + c) * hw;
        const __global T *gp = gy + gy_off + base, *xp = x + x_off + base;
        int i = 0;
        for (; i + 8 <= hw; i += 8)
            for (int l = 0; l < 8; ++l) {
                const ACC xv = XL(xp, i + l), g = MASKED(XL(gp, i + l), xv);
                a[l] += g;
                q[l] += g * (xv - mean);
            }
        for (; i < hw; ++i) {
            const ACC xv = XL(xp, i), g = MASKED(XL(gp, i), xv);
            a[0] += g;
            q[0] += g * (xv - mean);
        }
    }
    const ACC sg = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    const ACC sgxm = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
    if (S == 1) {
        finish_backward(c, C, (ACC)N * hw, sg, sgxm, mean, invstd, wc, beta, training, gw, gb, coef);
    } else {
        __global ACC *o = part + ((long)c * S + s) * 2;
        o[0] = sg;
        o[1] = sgxm;
    }
}

__kernel void batch_norm_backward_finalize(BWD_ARGS, const long M)
{
    const int c = get_global_id(0);
    if (c >= C) return;
    BWD_CONSTANTS;
    ACC sg = (ACC)0, sgxm = (ACC)0;
    for (int s = 0; s < S; ++s) {
        sg += part[((long)c * S + s) * 2];
        sgxm += part[((long)c * S + s) * 2 + 1];
    }
    finish_backward(c, C, (ACC)M, sg, sgxm, mean, invstd, wc, beta, training, gw, gb, coef);
}

// -- the elementwise passes ---------------------------------------------------------------------------

#if ACT == ACT_RELU
#define ACTIVATE(v) ((v) > (ACC)0 ? (v) : (ACC)0)   /* a select: fmax is a library call on PoCL */
#else
#define ACTIVATE(v) (v)
#endif

// y at load `at` (VEC values) of (N, C, HW / VEC) from the channel's mean, scale and beta
inline void apply_one(__global const T *x, const long x_off, __global T *out, const long at, const ACC mean,
                      const ACC scale, const ACC beta)
{
#if VEC == 4
    const XV4 v = XLOAD4(x + x_off, at);
    XV4 o;
    o.x = (XS)ACTIVATE(((ACC)v.x - mean) * scale + beta);
    o.y = (XS)ACTIVATE(((ACC)v.y - mean) * scale + beta);
    o.z = (XS)ACTIVATE(((ACC)v.z - mean) * scale + beta);
    o.w = (XS)ACTIVATE(((ACC)v.w - mean) * scale + beta);
    XSTORE4(out, at, o);
#else
    STORE_T(out, at, ACTIVATE((XL(x, x_off + at) - mean) * scale + beta));
#endif
}

__kernel void batch_norm_apply_flat(__global const T *x, const long x_off, __global const PT *stats,
                                    const long stats_off, __global T *out, const int C, const int NC)
{
    const int i = get_global_id(0), nc = get_global_id(1);
    if (i >= HW / VEC || nc >= NC) return;   // the launch may round the grid up to whole work-groups
    const int c = nc % C;
    const __global PT *st = stats + stats_off;
    apply_one(x, x_off, out, (long)nc * (HW / VEC) + i, LD(st, c), LD(st, 2 * C + c), LD(st, 3 * C + c));
}

__kernel void batch_norm_apply_runs(__global const T *x, const long x_off, __global const PT *stats,
                                    const long stats_off, __global T *out, const int C, const int NC, const int hw)
{
    const int nc = get_global_id(0);
    if (nc >= NC) return;
    const int c = nc % C;
    const __global PT *st = stats + stats_off;
    const ACC mean = LD(st, c), scale = LD(st, 2 * C + c), beta = LD(st, 3 * C + c);
    const __global T *xp = x + x_off + (long)nc * hw;
    __global T *yp = out + (long)nc * hw;
    for (int i = 0; i < hw; ++i) STORE_T(yp, i, ACTIVATE((XL(xp, i) - mean) * scale + beta));
}

// g' = grad_y, masked by the recomputed relu output when the forward fused one
#if ACT == ACT_RELU
#define GPRIME(g, xv) ((((xv) - mean) * k + beta) > (ACC)0 ? (g) : (ACC)0)
#else
#define GPRIME(g, xv) (g)
#endif
#define GRAD_X(g, xv) ((GPRIME((g), (xv)) - mg) * k - ((xv) - mean) * d)
#define COEF_LOAD                                                                                    \
    const __global PT *cf = coef + coef_off;                                                         \
    const ACC k = LD(cf, c), mg = LD(cf, C + c), mean = LD(cf, 2 * C + c), d = LD(cf, 3 * C + c);   \
    const ACC beta = LD(cf, 4 * C + c);                                                              \
    (void)beta

// grad_x at load `at` (VEC values) from the channel's coefficients (GRAD_X)
inline void grad_one(__global const T *gy, const long gy_off, __global const T *x, const long x_off,
                     __global T *out, const long at, const ACC k, const ACC mg, const ACC mean, const ACC d,
                     const ACC beta)
{
    (void)beta;
#if VEC == 4
    const XV4 g = XLOAD4(gy + gy_off, at);
    const XV4 v = XLOAD4(x + x_off, at);
    XV4 o;
    o.x = (XS)GRAD_X((ACC)g.x, (ACC)v.x);
    o.y = (XS)GRAD_X((ACC)g.y, (ACC)v.y);
    o.z = (XS)GRAD_X((ACC)g.z, (ACC)v.z);
    o.w = (XS)GRAD_X((ACC)g.w, (ACC)v.w);
    XSTORE4(out, at, o);
#else
    STORE_T(out, at, GRAD_X(XL(gy, gy_off + at), XL(x, x_off + at)));
#endif
}

__kernel void batch_norm_grad_input_flat(__global const T *gy, const long gy_off, __global const T *x,
                                         const long x_off, __global const PT *coef, const long coef_off,
                                         __global T *out, const int C, const int NC)
{
    const int i = get_global_id(0), nc = get_global_id(1);
    if (i >= HW / VEC || nc >= NC) return;
    const int c = nc % C;
    COEF_LOAD;
    grad_one(gy, gy_off, x, x_off, out, (long)nc * (HW / VEC) + i, k, mg, mean, d, beta);
}

__kernel void batch_norm_grad_input_runs(__global const T *gy, const long gy_off, __global const T *x,
                                         const long x_off, __global const PT *coef, const long coef_off,
                                         __global T *out, const int C, const int NC, const int hw)
{
    const int nc = get_global_id(0);
    if (nc >= NC) return;
    const int c = nc % C;
    COEF_LOAD;
    const long base = (long)nc * hw;
    const __global T *gp = gy + gy_off + base, *xp = x + x_off + base;
    __global T *op = out + base;
    for (int i = 0; i < hw; ++i) STORE_T(op, i, GRAD_X(XL(gp, i), XL(xp, i)));
}

// -- one launch a way: training, the _groups layout with LAST ------------------------------------------
// batch_norm_train_chain (the statistics, then batch_norm_apply) and batch_norm_backward_chain (the two
// sums, then batch_norm_grad_input), each in one launch of 2 * C * S work-groups of LOCAL, without the
// launch (and the driver's gap) between the reduction and the elementwise pass. A work-group takes a
// ticket (count[0]) when it starts: tickets 0 .. C*S-1 are the reduction's parts (c, s), as the _groups
// kernels, the channel's last part merging them (count[2 + c], nc_last_arrival) and then marking the
// channel ready (count[2 + C + c] = 1); tickets C*S .. 2*C*S-1 take the same parts (c, s) of the
// elementwise pass once channel c is ready, reading the channel's constants through CHAIN_LOAD. A
// work-group waits only on tickets taken before its own, by running work-groups that never wait, so no
// schedule deadlocks on any number of compute units (gemm_gemv.cl's gemv_chain argues the same; a
// one-thread CPU runs the work-groups in ticket order and nothing waits). The elementwise pass's last part
// of a channel clears its ready mark, the launch's last part (count[1]) the tickets: one zeroed buffer of
// 2 + 2C counts serves every launch and recorded replay (Queue.arrival_counts). Every work-item reaches
// every barrier (the elementwise parts run the reduction's tree on nothing).
#if LAST

// tickets and the part (c, s) a work-group takes; `apply`: the elementwise pass's
#define CHAIN_TICKET                                                                                 \
    __local int ticket;                                                                              \
    const int lid = get_local_id(0);                                                                 \
    if (lid == 0) ticket = atomic_inc(count);                                                        \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                    \
    const int parts = C * S, apply = ticket >= parts;                                                \
    const int cs = apply ? ticket - parts : ticket, c = cs / S, s = cs - (cs / S) * S;               \
    __global int *ready = count + 2 + C

// work-item 0 of a reduction part that finished channel c marks it ready; an elementwise part waits for it
#define CHAIN_READY(done)                                                                            \
    if (lid == 0 && !apply && (done)) {                                                              \
        NC_FENCE_DEVICE();                                                                           \
        atomic_xchg(ready + c, 1);                                                                   \
    }                                                                                                \
    if (lid == 0 && apply)                                                                           \
        nc_wait_at_least(ready + c, 1);                                                              \
    barrier(CLK_GLOBAL_MEM_FENCE);                                                                   \
    mem_fence(CLK_GLOBAL_MEM_FENCE)

// an elementwise part done: the channel's last clears its mark, the launch's last the tickets
#define CHAIN_DONE                                                                                   \
    if (lid == 0 && apply) {                                                                         \
        if (atomic_inc(ready + c) == S) atomic_xchg(ready + c, 0);                                   \
        if (atomic_inc(count + 1) == parts - 1) {                                                    \
            atomic_xchg(count + 1, 0);                                                               \
            atomic_xchg(count, 0);                                                                   \
        }                                                                                            \
    }

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void batch_norm_train_chain(STATS_ARGS, __global int *count, __global T *out)
{
    __local ACC sn[LOCAL], sm[LOCAL], sq[LOCAL];
    CHAIN_TICKET;
    PART_RANGE(s);
    ACC n, mean, m2;
    stats_part(c, start, apply ? start : end, x, x_off, C, &n, &mean, &m2, sn, sm, sq);
    int done = 0;
    if (lid == 0 && !apply) {
        if (S == 1) {
            finish_stats(c, C, n, mean, m2, STATS_PASS);
            done = 1;
        } else {
            done = stats_arrive(c, s, n, mean, m2, part, count + 2, C, S, STATS_PASS);
        }
    }
    CHAIN_READY(done);
    if (apply) {
        const ACC cmean = CHAIN_LOAD(stats, c), scale = CHAIN_LOAD(stats, 2 * C + c);
        const ACC beta = CHAIN_LOAD(stats, 3 * C + c);
        for (long j = start + lid; j < end; j += LOCAL) {
            const long img = j / (HW / VEC), i = j - img * (HW / VEC);
            apply_one(x, x_off, out, (img * C + c) * (HW / VEC) + i, cmean, scale, beta);
        }
    }
    CHAIN_DONE;
}

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void batch_norm_backward_chain(BWD_ARGS, __global int *count, __global T *out)
{
    __local ACC s1[LOCAL], s2[LOCAL];
    CHAIN_TICKET;
    BWD_CONSTANTS;
    PART_RANGE(s);
    ACC sg, sgxm;
    sums_part(c, start, apply ? start : end, gy, gy_off, x, x_off, C, mean, scale, beta, &sg, &sgxm, s1, s2);
    int done = 0;
    if (lid == 0 && !apply) {
        if (S == 1) {
            finish_backward(c, C, (ACC)N * HW, sg, sgxm, mean, invstd, wc, beta, training, gw, gb, coef);
            done = 1;
        } else {
            done = backward_arrive(c, s, sg, sgxm, part, count + 2, N, C, S, mean, invstd, wc, beta, training,
                                   gw, gb, coef);
        }
    }
    CHAIN_READY(done);
    if (apply) {
        const ACC k = CHAIN_LOAD(coef, c), mg = CHAIN_LOAD(coef, C + c), cmean = CHAIN_LOAD(coef, 2 * C + c);
        const ACC d = CHAIN_LOAD(coef, 3 * C + c), cbeta = CHAIN_LOAD(coef, 4 * C + c);
        for (long j = start + lid; j < end; j += LOCAL) {
            const long img = j / (HW / VEC), i = j - img * (HW / VEC);
            grad_one(gy, gy_off, x, x_off, out, (img * C + c) * (HW / VEC) + i, k, mg, cmean, d, cbeta);
        }
    }
    CHAIN_DONE;
}
#endif  // LAST
