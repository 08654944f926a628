// k-means kernels shared by every device class (netcl/ops/kmeans.py launches them): the end of a
// Lloyd or mini-batch update (partial sums -> new centers), k-means++ seeding, row gathers and the
// distance of each row to its given center. The assignment and the partial sums have a CPU- and a
// GPU-shaped variant each (kmeans_cpu.cl, kmeans_gpu.cl). Data layout and shift: kmeans_common.cl.
// Knobs (set by the host):
//   WG      work-group size of the kernels below that have one: 1 on CPUs (no barriers are paid), a
//           power of two on GPUs
//   VF      features per vector in row distances: 1, 2, 4 or 8, at most 32 bytes (float8, double4)
//   BLK     rows per k-means++ block (a multiple of WG): the blocks of the weighted-distance prefix
//           sums that k-means++ samples from, and of the candidate potentials
//   TRIALS  k-means++ candidates per center (2 + log(n_clusters), scikit-learn's choice)

#include "kmeans_common.cl"

#ifndef WG
#define WG 1
#endif
#ifndef VF
#define VF 1
#endif
#ifndef BLK
#define BLK 256
#endif
#ifndef TRIALS
#define TRIALS 1
#endif
#if (WG & (WG - 1)) || (BLK % WG)
#error "kmeans.cl: WG must be a power of two that divides BLK"
#endif

#if VF > 1
#define ACCV KM_CAT(ACC, VF)
#define VLOADF(p) KM_CAT(vload, VF)(0, p)
#define XLOADF(p) XLOADV(VF, p)
typedef union { ACCV v; ACC s[VF]; } km_lanes;
inline ACC km_hsum(const ACCV v)
{
    km_lanes l;
    l.v = v;
    ACC s = l.s[0];
    for (int i = 1; i < VF; ++i) s += l.s[i];
    return s;
}
#else
#define ACCV ACC
#define VLOADF(p) (*(p))
#define XLOADF(p) XLOAD(p, 0)
#define km_hsum(v) (v)
#endif

// dist[t] = ||(xr - shift) - c_t||^2 over d features for NC centers c_t = c + t * d (the row is read once).
#define KM_SQDISTS(NC, dist, xr, shift, c, d)                                                         \
    do {                                                                                              \
        ACCV acc_[NC];                                                                                \
        for (int t_ = 0; t_ < (NC); ++t_) acc_[t_] = (ACCV)0;                                         \
        int f_ = 0;                                                                                   \
        for (; f_ + VF <= (d); f_ += VF) {                                                            \
            const ACCV xv_ = XLOADF((xr) + f_) - VLOADF((shift) + f_);                                \
            for (int t_ = 0; t_ < (NC); ++t_) {                                                       \
                const ACCV diff_ = xv_ - VLOADF((c) + (long)t_ * (d) + f_);                           \
                acc_[t_] += diff_ * diff_;                                                            \
            }                                                                                         \
        }                                                                                             \
        for (int t_ = 0; t_ < (NC); ++t_) (dist)[t_] = km_hsum(acc_[t_]);                             \
        for (; f_ < (d); ++f_) {                                                                      \
            const ACC xs_ = XLOAD(xr, f_) - (ACC)(shift)[f_];                                         \
            for (int t_ = 0; t_ < (NC); ++t_) {                                                       \
                const ACC diff_ = xs_ - (ACC)(c)[(long)t_ * (d) + f_];                                \
                (dist)[t_] += diff_ * diff_;                                                          \
            }                                                                                         \
        }                                                                                             \
    } while (0)

inline ACC km_sqdist(__global const XT *xr, __global const T *shift, __global const T *c, const int d)
{
    ACC dist[1];
    KM_SQDISTS(1, dist, xr, shift, c, d);
    return dist[0];
}

// Sum of v over the work-group into red[0] (red: WG values; every work-item must call it).
inline ACC km_group_sum(__local ACC *red, const ACC v)
{
    const int lid = get_local_id(0);
    red[lid] = v;
    for (int s = WG / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < s) red[lid] += red[lid + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const ACC out = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return out;
}

// New centers from the partial sums of kmeans_update(_cpu): one work-group per cluster c.
// weight = sum_s pw[s, c]; sums[c] = sum_s psum[s, c, :]; new_c[c] = sums[c] * (1 / weight), or old_c[c]
// when the cluster is empty (the host then relocates it, as scikit-learn does).
// stats: [c] weight, [k + c] squared shift ||new_c[c] - old_c[c]||^2, [2k] inertia (sum of pin).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void kmeans_finalize(__global const ACC *psum, __global const ACC *pw, __global const ACC *pin, const int nseg,
                     const int npin, const int k, const int d, __global const T *old_c, __global T *new_c,
                     __global ACC *sums, __global ACC *stats)
{
    __local ACC red[WG];
    const int c = get_group_id(0);
    const int lid = get_local_id(0);
    ACC weight = 0;
    for (int s = 0; s < nseg; ++s) weight += pw[(long)s * k + c];
    const ACC scale = weight > (ACC)0 ? (ACC)1 / weight : (ACC)0;
    ACC moved = 0;
    for (int f = lid; f < d; f += WG) {
        ACC sum = 0;
        for (int s = 0; s < nseg; ++s) sum += psum[((long)s * k + c) * d + f];
        sums[(long)c * d + f] = sum;
        const ACC old = old_c[(long)c * d + f];
        const ACC v = weight > (ACC)0 ? sum * scale : old;
        new_c[(long)c * d + f] = v;
        moved += (v - old) * (v - old);
    }
    moved = km_group_sum(red, moved);
    if (lid == 0) {
        stats[c] = weight;
        stats[k + c] = moved;
        if (c == 0) {
            ACC inertia = 0;
            for (int i = 0; i < npin; ++i) inertia += pin[i];
            stats[2 * k] = inertia;
        }
    }
}

// Mini-batch update (scikit-learn's _minibatch_update_dense): with b = the batch's weight in cluster c
// and count = counts[c], a cluster the batch touched moves to (old * count + batch sum) / (count + b)
// and counts[c] grows by b; the others keep their center. One work-group per cluster.
// stats: [c] b, [k + c] squared shift, [2k] the batch's inertia.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void kmeans_minibatch_finalize(__global const ACC *psum, __global const ACC *pw, __global const ACC *pin,
                               const int nseg, const int npin, const int k, const int d, __global const T *old_c,
                               __global T *new_c, __global ACC *counts, __global ACC *stats)
{
    __local ACC red[WG];
    const int c = get_group_id(0);
    const int lid = get_local_id(0);
    ACC b = 0;
    for (int s = 0; s < nseg; ++s) b += pw[(long)s * k + c];
    const ACC count = counts[c];
    const ACC total = count + b;
    const ACC scale = (ACC)1 / total;
    ACC moved = 0;
    for (int f = lid; f < d; f += WG) {
        const ACC old = old_c[(long)c * d + f];
        ACC v = old;
        if (b > (ACC)0) {
            ACC sum = 0;
            for (int s = 0; s < nseg; ++s) sum += psum[((long)s * k + c) * d + f];
            v = (old * count + sum) * scale;
        }
        new_c[(long)c * d + f] = v;
        moved += (v - old) * (v - old);
    }
    moved = km_group_sum(red, moved);
    barrier(CLK_GLOBAL_MEM_FENCE);  // every work-item has read counts[c]
    if (lid == 0) {
        if (b > (ACC)0) counts[c] = total;
        stats[c] = b;
        stats[k + c] = moved;
        if (c == 0) {
            ACC inertia = 0;
            for (int i = 0; i < npin; ++i) inertia += pin[i];
            stats[2 * k] = inertia;
        }
    }
}

// k-means++, step 1 for center number c: the potential of each of the TRIALS candidates (rows of `cand`,
// centred), sum over rows of w * min(closest, ||x - cand_t||^2), as partial sums per block of BLK rows:
// part[block, t]. Layout: one work-group per block (row0 is a multiple of BLK), rows lid + j * WG.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void kmeans_pp_potential(__global const XT *x, const long x_off, const int n, const int d, const long row0,
                         __global const T *shift, __global const T *w, __global const T *cand,
                         __global const T *closest, __global ACC *part)
{
    __local ACC red[WG];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * BLK;
    ACC pot[TRIALS];
    for (int t = 0; t < TRIALS; ++t) pot[t] = 0;
    for (int j = 0; j < BLK / WG; ++j) {
        const long i = base + j * WG + lid;
        if (i >= n) break;
        __global const XT *xr = x + x_off + i * d;
        const ACC near = closest[row0 + i];
        const ACC wt = KM_WEIGHT(w, row0 + i);
        ACC dist[TRIALS];
        KM_SQDISTS(TRIALS, dist, xr, shift, cand, d);
        for (int t = 0; t < TRIALS; ++t) pot[t] += wt * fmin(near, dist[t]);
    }
    const long block = row0 / BLK + get_group_id(0);
    for (int t = 0; t < TRIALS; ++t) {
        const ACC s = km_group_sum(red, pot[t]);
        if (lid == 0) part[block * TRIALS + t] = s;
    }
}

// k-means++, step 3: closest[i] = min(closest[i], ||x_i - center||^2) for the center just chosen
// (centers row c), and the block sums of w * closest that the next search samples from.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void kmeans_pp_update(__global const XT *x, const long x_off, const int n, const int d, const long row0,
                      __global const T *shift, __global const T *w, __global const T *centers, const long c_off,
                      __global T *closest, __global ACC *bsum)
{
    __local ACC red[WG];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * BLK;
    ACC pot = 0;
    for (int j = 0; j < BLK / WG; ++j) {
        const long i = base + j * WG + lid;
        if (i >= n) break;
        const ACC near = fmin((ACC)closest[row0 + i], km_sqdist(x + x_off + i * d, shift, centers + c_off, d));
        closest[row0 + i] = near;
        pot += KM_WEIGHT(w, row0 + i) * near;
    }
    const ACC s = km_group_sum(red, pot);
    if (lid == 0) bsum[row0 / BLK + get_group_id(0)] = s;
}

// k-means++, step 0: the candidates of center number c, one work-group per candidate t: the first row i
// whose running sum of w * closest reaches u[t] * (the total), as numpy.searchsorted does on the cumsum
// (the last row when rounding leaves the target past the end). The search walks the block sums (each
// work-item sums a range of blocks, then work-item 0 finds the range, the block, and the row).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void kmeans_pp_search(__global const ACC *bsum, const int nblk, __global const T *closest, __global const T *w,
                      const long nrows, __global const T *uniforms, const long u_off, __global int *cand_ids)
{
    __local ACC part[WG];
    const int lid = get_local_id(0);
    const int t = get_group_id(0);
    const int per = (nblk + WG - 1) / WG;
    ACC s = 0;
    for (int b = lid * per; b < min(nblk, (lid + 1) * per); ++b) s += bsum[b];
    part[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid != 0) return;
    ACC total = 0;
    for (int l = 0; l < WG; ++l) total += part[l];
    const ACC target = (ACC)uniforms[u_off + t] * total;
    const int last_range = (nblk - 1) / per;  // work-items past it summed nothing
    ACC acc = 0;
    int l = 0;
    for (; l < last_range; ++l) {
        if (acc + part[l] >= target) break;
        acc += part[l];
    }
    const int bend = min(nblk, (l + 1) * per);
    int b = l * per;
    for (; b < bend - 1; ++b) {
        if (acc + bsum[b] >= target) break;
        acc += bsum[b];
    }
    long i = (long)b * BLK;
    const long iend = min(nrows, i + BLK);
    for (; i < iend - 1; ++i) {
        const ACC v = KM_WEIGHT(w, i) * (ACC)closest[i];
        if (acc + v >= target) break;
        acc += v;
    }
    cand_ids[t] = (int)i;
}

// k-means++, step 2: the candidate with the smallest potential (the first on ties) becomes center c:
// its row of `cand` is copied to centers row c and its data-set row index to chosen[c].
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void kmeans_pp_pick(__global const ACC *part, const int nblk, __global const int *cand_ids,
                    __global const T *cand, const int d, const int c, __global T *centers, __global int *chosen)
{
    __local ACC pots[TRIALS];
    __local int pick[1];
    const int lid = get_local_id(0);
    for (int t = lid; t < TRIALS; t += WG) {
        ACC s = 0;
        for (int b = 0; b < nblk; ++b) s += part[(long)b * TRIALS + t];
        pots[t] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        int best = 0;
        for (int t = 1; t < TRIALS; ++t)
            if (pots[t] < pots[best]) best = t;
        pick[0] = best;
        chosen[c] = cand_ids[best];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int best = pick[0];
    for (int f = lid; f < d; f += WG) centers[(long)c * d + f] = cand[(long)best * d + f];
}

// out row (scatter ? dst_idx[j] : j) = x row src_idx[j] (minus shift when `subtract`), for j < count.
// OUT_X (half data only): out is XT too and takes the elements' bits as they are (no shift); else out
// is T. Layout: global (d, count), one element per work-item.
#ifdef OUT_X
#if !defined(X_HALF) && !defined(X_BF16)
#error "kmeans_copy_rows: OUT_X copies half data"
#endif
#define OUT_T XT
#else
#define OUT_T T
#endif
__kernel void kmeans_copy_rows(__global const XT *x, const long x_off, const int d, __global const T *shift,
                               const int subtract, __global const int *src_idx, __global const int *dst_idx,
                               const int scatter, const int count, __global OUT_T *out, const long out_off)
{
    const int f = get_global_id(0);
    const int j = get_global_id(1);
    if (f >= d || j >= count) return;
    const long src = x_off + (long)src_idx[j] * d + f;
    const long row = scatter ? dst_idx[j] : j;
#ifdef OUT_X
    ((__global ushort *)out)[out_off + row * d + f] = ((__global const ushort *)x)[src];  // the bits
#else
    ACC v = XLOAD(x, src);
    if (subtract) v -= (ACC)shift[f];
    out[out_off + row * d + f] = v;
#endif
}

// dist[row0 + i] = ||x_i - centers[labels[row0 + i]]||^2 (the inertia of given labels). One row per
// work-item.
__kernel void kmeans_label_distance(__global const XT *x, const long x_off, const int n, const int d,
                                    const long row0, __global const T *shift, __global const T *centers,
                                    __global const int *labels, __global T *dist)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    dist[row0 + i] = km_sqdist(x + x_off + i * d, shift, centers + (long)labels[row0 + i] * d, d);
}
