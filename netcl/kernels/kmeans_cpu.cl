// k-means for CPU devices (PoCL and other CPU drivers): the assignment step and the partial sums of the
// update step shaped like gemm_cpu.cl, one work-item per work-group, no barriers, explicit vectors.
// Data layout and shift: kmeans_common.cl.
//
// kmeans_pack_cpu: the centers (k x d, row-major, centred) as kpad/VN panels of d x VN values (panel p,
// feature f, lane l = center p*VN + l; zero-padded) and their squared norms cn (kpad, +inf for padding).
//
// kmeans_assign_cpu: label[i] = argmin_c ||x_i - c||^2 (the first on ties, as scikit-learn), computed as
// argmin_c (||c||^2 - 2 x_i.c); dist[i] = the exact ||x_i - c_label||^2. No n x k buffer.
// Layout: global ceil(n/MB), local 1: a work-item owns MB rows, staged centred in local scratch (MB x d).
// It walks the centers PB panels (PB*VN centers) at a time, in the order of GEMM's loops: for each panel
// block, each register block of RM rows accumulates RM x PB vectors of VN dot products over the features
// (PB vector loads and RM broadcasts per feature, RM*PB independent FMAs), so a panel block stays in L1
// while the MB rows pass it; the block's values are folded into the rows' running (min, index) vectors
// (local scratch; lane l tracks centers l, l + VN, ... in increasing order). The lanes are folded at
// the end (ties by index), so the result is the first minimum. Counts labels that changed when
// count_changes is set (one atomic per work-item).
// Half data (X_HALF / X_BF16) is converted to float as it is staged. Reads x, shift, cp, cn, centers (and
// labels); writes labels, dist, changed. Local scratch MB*DSTAGE
// values + MB*(VN values + VN indices).
//
// kmeans_update_cpu: the per-cluster sums of the update step. Work-item s owns the rows of segment s
// (rows s*seg ...) and walks them in order, adding w * (x - shift) to its own partial sums psum[s, label]
// (vectors of VF features), w to pw[s, label] and w * dist to pin[s]. Its sums start from what psum,
// pw and pin hold, so a segment split over several launches (streamed chunks) adds up exactly as one
// launch does. Same arguments as kmeans_gpu.cl's kmeans_update (nkc is 1). Reads x, shift, labels,
// dist, w; reads and writes psum, pw, pin.
//
// Knobs: VN (centers per vector: 4 or 8 for float, 4 for double; at most 32 bytes, see gemm_cpu.cl),
// PB (panels per block: RM*PB accumulator vectors, default 2), RM (rows per register block, default 4),
// MB (rows per work-item, a multiple of RM, default 64), DSTAGE (features staged per row: at least d;
// the host sets it), VF (features per vector in kmeans_update_cpu: 1, 2, 4 or 8, at most 32 bytes).

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
#ifndef PB
#define PB 2
#endif
#ifndef DSTAGE
#error "kmeans_cpu.cl: the host sets DSTAGE (features staged per row, >= d)"
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
#elif VN == 16
#define LANE_IDS ((IVT)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
#else
#error "kmeans_cpu.cl: VN must be 4, 8 or 16"
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
void kmeans_assign_cpu(__global const XT *x, const long x_off, const int n, const int d, const long row0,
                       __global const T *shift, __global const T *cp, __global const T *cn, const int kpad,
                       __global const T *centers, __global int *labels, __global T *dist,
                       __global int *changed, const int count_changes)
{
    __local ACC xs[MB * DSTAGE];   // the work-item's rows, centred (row r at xs + r * d)
    __local VT bestv[MB];          // running minimum per row and lane
    __local IVT besti[MB];
    const long m0 = (long)get_group_id(0) * MB;
    const int rows = (int)min((long)MB, n - m0);
    const int npanels = kpad / VN;
    __global const VT *panels = (__global const VT *)cp;
    __global const VT *norms = (__global const VT *)cn;

    for (int r = 0; r < MB; ++r) {  // rows past n repeat the last one (their results are dropped)
        __global const XT *xr = x + x_off + (m0 + min(r, rows - 1)) * d;
        for (int f = 0; f < d; ++f) xs[r * d + f] = XLOAD(xr, f) - (ACC)shift[f];
        bestv[r] = (VT)KM_INF;
        besti[r] = (IVT)0;
    }
    for (int p0 = 0; p0 < npanels; p0 += PB) {
        __global const VT *block = panels + (long)p0 * d;  // PB panels of d x VN, one after the other
        for (int r0 = 0; r0 < rows; r0 += RM) {
            VT acc[RM][PB];
            for (int r = 0; r < RM; ++r)
                for (int q = 0; q < PB; ++q) acc[r][q] = (VT)0;
            __local const ACC *xr = xs + r0 * d;
            for (int f = 0; f < d; ++f) {
                VT cv[PB];
                for (int q = 0; q < PB; ++q) cv[q] = block[q * d + f];
                for (int r = 0; r < RM; ++r) {
                    const VT xv = (VT)(xr[r * d + f]);
                    for (int q = 0; q < PB; ++q) acc[r][q] += xv * cv[q];
                }
            }
            for (int r = 0; r < RM; ++r) {
                VT bv = bestv[r0 + r];
                IVT bi = besti[r0 + r];
                for (int q = 0; q < PB; ++q) {  // panels in increasing center order: strict < keeps the first
                    const VT v = norms[p0 + q] - (VT)2 * acc[r][q];
                    const IVT better = v < bv;
                    bv = better ? v : bv;
                    bi = better ? (IVT)((p0 + q) * VN) + LANE_IDS : bi;
                }
                bestv[r0 + r] = bv;
                besti[r0 + r] = bi;
            }
        }
    }
    int mine = 0;
    for (int r = 0; r < rows; ++r) {
        const long row = m0 + r;
        vt_lanes bl;
        ivt_lanes il;
        bl.v = bestv[r];
        il.v = besti[r];
        ACC v = bl.s[0];
        int c = (int)il.s[0];
        for (int l = 1; l < VN; ++l) {
            if (bl.s[l] < v || (bl.s[l] == v && (int)il.s[l] < c)) {
                v = bl.s[l];
                c = (int)il.s[l];
            }
        }
        __global const T *cr = centers + (long)c * d;
        __local const ACC *xr = xs + r * d;
        ACC s = 0;
        for (int f = 0; f < d; ++f) {
            const ACC diff = xr[f] - (ACC)cr[f];
            s += diff * diff;
        }
        if (count_changes && labels[row0 + row] != c) ++mine;
        labels[row0 + row] = c;
        dist[row0 + row] = s;
    }
    if (count_changes && mine) atomic_add(changed, mine);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void kmeans_update_cpu(__global const XT *x, const long x_off, const int n, const int d, const long row0,
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
        __global const XT *xr = x + x_off + (i - row0) * d;
        __global ACC *acc = ps + (long)lab * d;
        int f = 0;
#if VF > 1
        for (; f + VF <= d; f += VF) {
            const KM_CAT(ACC, VF) v = XLOADV(VF, xr + f) - KM_CAT(vload, VF)(0, shift + f);
            KM_CAT(vstore, VF)(KM_CAT(vload, VF)(0, acc + f) + wt * v, 0, acc + f);
        }
#endif
        for (; f < d; ++f) acc[f] += wt * (XLOAD(xr, f) - (ACC)shift[f]);
        pws[lab] += wt;
        inertia += wt * (ACC)dist[i];
    }
    pin[s * nkc] = inertia;
}
