// k-means for CPU devices (PoCL and other CPU drivers): the assignment step and the partial sums of the
// update step shaped like gemm_cpu.cl, one work-item per work-group, no barriers, explicit vectors.
// Data layout and shift: kmeans_common.cl.
//
// kmeans_pack_cpu: the centers (k x d, row-major, centred) as kpad/VN panels of d x VN values (panel p,
// feature f, lane l = center p*VN + l; zero-padded) and their squared norms cn (kpad, +inf for padding).
//
// kmeans_assign_cpu: label[i] = argmin_c ||x_i - c||^2 (the first on ties, as scikit-learn), computed as
// argmin_c (||c||^2 - 2 x_i.c); dist[i] = the exact ||x_i - c_label||^2. No n x k buffer.
// Layout: global ceil(n/MB), local 1: a work-item owns MB rows and walks them RM at a time. The RM rows
// (centred) are staged in local scratch; for each panel of VN centers a register block of RM vectors of
// VN dot products is accumulated over the features (one vector load of the panel per feature, RM
// broadcast FMAs), and folded into RM running (min, index) vectors, lane l tracking centers l, l + VN,
// ... in increasing order; the lanes are folded at the end (ties by index), so the result is the first
// minimum. Counts labels that changed when count_changes is set (one atomic per work-item).
// Reads x, shift, cp, cn, centers (and labels); writes labels, dist, changed. Local scratch RM*DMAX.
//
// kmeans_update_cpu: the per-cluster sums of the update step. Work-item s owns the rows of segment s
// (rows s*seg ...) and walks them in order, adding w * (x - shift) to its own partial sums psum[s, label]
// (vectors of VF features), w to pw[s, label] and w * dist to pin[s]. Its sums start from what psum,
// pw and pin hold, so a segment split over several launches (streamed chunks) adds up exactly as one
// launch does. Same arguments as kmeans_gpu.cl's kmeans_update (nkc is 1). Reads x, shift, labels,
// dist, w; reads and writes psum, pw, pin.
//
// Knobs: VN (centers per vector: 4 or 8 for float, 4 for double; at most 32 bytes, see gemm_cpu.cl),
// RM (rows per register block, default 4), MB (rows per work-item, default 64), DMAX (features staged at
// once, default 256; wider rows are staged again for every panel), VF (features per vector in
// kmeans_update_cpu: 1, 2, 4 or 8, at most 32 bytes).

#include "kmeans_common.cl"

#ifndef VN
#define VN 8
#endif
#ifndef RM
#define RM 4
#endif
#ifndef MB
#define MB 64
#endif
#ifndef DMAX
#define DMAX 256
#endif
#ifndef VF
#define VF 1
#endif

#define VT KM_CAT(ACC, VN)
#ifdef USE_FP64
#define IDX_T long             // comparing two VTs gives a vector of IDX_T
#else
#define IDX_T int
#endif
#define IVT KM_CAT(IDX_T, VN)
#if VN == 4
#define LANE_IDS ((IVT)(0, 1, 2, 3))
#elif VN == 8
#define LANE_IDS ((IVT)(0, 1, 2, 3, 4, 5, 6, 7))
#else
#error "kmeans_cpu.cl: VN must be 4 or 8"
#endif
typedef union { VT v; ACC s[VN]; } vt_lanes;   // lanes read through memory, not a library call
typedef union { IVT v; IDX_T s[VN]; } ivt_lanes;

__kernel void kmeans_pack_cpu(__global const T *centers, const int k, const int d, const int kpad,
                              __global T *cp, __global T *cn)
{
    const int c = get_global_id(0);
    if (c >= kpad) return;
    const int p = c / VN, l = c % VN;
    ACC norm = 0;
    for (int f = 0; f < d; ++f) {
        const ACC v = c < k ? (ACC)centers[(long)c * d + f] : (ACC)0;
        cp[((long)p * d + f) * VN + l] = v;
        norm += v * v;
    }
    cn[c] = c < k ? norm : KM_INF;
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void kmeans_assign_cpu(__global const T *x, const long x_off, const int n, const int d, const long row0,
                       __global const T *shift, __global const T *cp, __global const T *cn, const int kpad,
                       __global const T *centers, __global int *labels, __global T *dist,
                       __global int *changed, const int count_changes)
{
    __local ACC xs[RM * DMAX];
    const long m0 = (long)get_group_id(0) * MB;
    const int npanels = kpad / VN;
    __global const VT *panels = (__global const VT *)cp;
    __global const VT *norms = (__global const VT *)cn;
    int mine = 0;
    for (int i0 = 0; i0 < MB && m0 + i0 < n; i0 += RM) {
        long rows[RM];
        VT best[RM];
        IVT best_idx[RM];
        for (int r = 0; r < RM; ++r) {
            rows[r] = min(m0 + i0 + r, (long)n - 1);  // rows past n repeat the last one, results dropped
            best[r] = (VT)KM_INF;
            best_idx[r] = (IVT)0;
        }
        for (int p = 0; p < npanels; ++p) {
            VT acc[RM];
            for (int r = 0; r < RM; ++r) acc[r] = (VT)0;
            for (int f0 = 0; f0 < d; f0 += DMAX) {
                const int kl = min(DMAX, d - f0);
                if (p == 0 || d > DMAX) {
                    for (int r = 0; r < RM; ++r) {
                        __global const T *xr = x + x_off + rows[r] * d + f0;
                        for (int f = 0; f < kl; ++f) xs[r * DMAX + f] = (ACC)xr[f] - (ACC)shift[f0 + f];
                    }
                }
                __global const VT *panel = panels + (long)p * d + f0;
                for (int f = 0; f < kl; ++f) {
                    const VT cv = panel[f];
                    for (int r = 0; r < RM; ++r) acc[r] += (VT)(xs[r * DMAX + f]) * cv;
                }
            }
            const VT nv = norms[p];
            const IVT ids = (IVT)(p * VN) + LANE_IDS;
            for (int r = 0; r < RM; ++r) {
                const VT v = nv - (VT)2 * acc[r];
                const IVT better = v < best[r];
                best[r] = better ? v : best[r];
                best_idx[r] = better ? ids : best_idx[r];
            }
        }
        for (int r = 0; r < RM; ++r) {
            const long row = m0 + i0 + r;
            if (row >= n) break;
            vt_lanes bl;
            ivt_lanes il;
            bl.v = best[r];
            il.v = best_idx[r];
            ACC v = bl.s[0];
            int c = (int)il.s[0];
            for (int l = 1; l < VN; ++l) {
                if (bl.s[l] < v || (bl.s[l] == v && (int)il.s[l] < c)) {
                    v = bl.s[l];
                    c = (int)il.s[l];
                }
            }
            __global const T *cr = centers + (long)c * d;
            ACC s = 0;
            if (d <= DMAX) {
                for (int f = 0; f < d; ++f) {
                    const ACC diff = xs[r * DMAX + f] - (ACC)cr[f];
                    s += diff * diff;
                }
            } else {
                __global const T *xr = x + x_off + row * d;
                for (int f = 0; f < d; ++f) {
                    const ACC diff = ((ACC)xr[f] - (ACC)shift[f]) - (ACC)cr[f];
                    s += diff * diff;
                }
            }
            if (count_changes && labels[row0 + row] != c) ++mine;
            labels[row0 + row] = c;
            dist[row0 + row] = s;
        }
    }
    if (count_changes && mine) atomic_add(changed, mine);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void kmeans_update_cpu(__global const T *x, const long x_off, const int n, const int d, const long row0,
                       __global const T *shift, __global const int *labels, __global const T *dist,
                       __global const T *w, const long seg, const long first_seg, const int k, const int nkc,
                       __global ACC *psum, __global ACC *pw, __global ACC *pin)
{
    const long s = first_seg + get_group_id(0);
    const long lo = max(s * seg, row0);
    const long hi = min((s + 1) * seg, row0 + n);
    __global ACC *ps = psum + s * k * d;
    __global ACC *pws = pw + s * k;
    ACC inertia = pin[s * nkc];
    for (long i = lo; i < hi; ++i) {
        const int lab = labels[i];
        const ACC wt = KM_WEIGHT(w, i);
        __global const T *xr = x + x_off + (i - row0) * d;
        __global ACC *acc = ps + (long)lab * d;
        int f = 0;
#if VF > 1
        for (; f + VF <= d; f += VF) {
            const KM_CAT(ACC, VF) v = KM_CAT(vload, VF)(0, xr + f) - KM_CAT(vload, VF)(0, shift + f);
            KM_CAT(vstore, VF)(KM_CAT(vload, VF)(0, acc + f) + wt * v, 0, acc + f);
        }
#endif
        for (; f < d; ++f) acc[f] += wt * ((ACC)xr[f] - (ACC)shift[f]);
        pws[lab] += wt;
        inertia += wt * (ACC)dist[i];
    }
    pin[s * nkc] = inertia;
}
