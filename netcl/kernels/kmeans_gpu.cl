// k-means for GPUs: the assignment step as one GEMM-shaped kernel with an arg-min epilogue, and the
// partial sums of the update step. Data layout and shift: kmeans_common.cl.
//
// kmeans_pack: the centers (k x d, row-major, centred) transposed into ct (dpad x kpad, feature-major,
// zero-padded) and their squared norms cn (kpad; +inf for the padding, which so never wins).
//
// kmeans_assign: label[i] = argmin_c ||x_i - c||^2 (the first on ties, as scikit-learn), computed as
// argmin_c (||c||^2 - 2 x_i.c); dist[i] = the exact ||x_i - c_label||^2 of the winner. No n x k buffer.
// Layout: local (TX, TY), global (ceil(n/BM) * TX, TY). A work-group owns BM = TY*TM rows; it streams
// the centers through local memory in tiles of BN = TX*TN centers x BK features (the rows' BM x BK tile
// beside it), and each work-item keeps a TM x TN register tile of dot products: rows ty*4 + g*TY*4 + v,
// centers tx*4 + g*TX*4 + v (groups of 4 so the local reads are float4s: neighbouring work-items read
// neighbouring vectors, and the 16 work-items of one ty read one broadcast vector). After a tile's
// features are done, each work-item folds its TN candidates into a running (min, index) per row held in
// registers; work-items visit their centers in increasing order and the final fold across the TX
// work-items of a row breaks ties by index, so the result is the first minimum. The exact distance of
// the winner is then summed by the TX work-items of the row (features tx, tx + TX, ...), and the labels
// that changed are counted (one atomic per work-group) when count_changes is set.
// Reads x, shift, ct, cn, centers (and labels); writes labels, dist, changed.
// Local memory: BK*(BM + 4) + BK*(BN + 4) values (reused for the folds) + BM*TX ints.
//
// kmeans_update: the per-cluster sums of the update step without atomics and without sorting. Rows are
// cut into segments of `seg` rows (segment s: rows s*seg ...); work-group (s, cc, fc) owns segment s,
// clusters cc*KC ... (KC of them) and features fc*WGU ... (one per work-item). Its accumulators start
// from psum/pw (so a segment split over several launches, as streamed chunks are, adds up exactly as
// one launch does) and live in local memory: the work-group walks its rows in order, WGU labels at a
// time staged in local memory, and every work-item adds its own feature of the rows whose label is
// one of its clusters (no two work-items write one accumulator). Work-groups of the first feature
// block also add the rows' weights (pw[s, c]) and their share of the inertia, w * dist, into
// pin[s * nkc + cc]. Reads x, shift, labels, dist, w; reads and writes psum, pw, pin.
// Local memory: KC*WGU + KC + 3*WGU values.
//
// Knobs: TX, TY (work-group shape, default 16 x 16), TM, TN (register tile, multiples of 4, default 8),
// BK (features per local tile, default 16); WGU (work-items of kmeans_update = features per
// work-group, default 64), KC (clusters per kmeans_update work-group, default 128).

#include "kmeans_common.cl"

#ifndef TX
#define TX 16
#endif
#ifndef TY
#define TY 16
#endif
#ifndef TM
#define TM 8
#endif
#ifndef TN
#define TN 8
#endif
#ifndef BK
#define BK 16
#endif
#ifndef WGU
#define WGU 64
#endif
#ifndef KC
#define KC 128
#endif

#define NT (TX * TY)
#define BM (TY * TM)
#define BN (TX * TN)
#define LXS (BM + 4)   // local row lengths: +4 keeps float4 alignment and spreads banks
#define LCS (BN + 4)

#if (TM % 4) || (TN % 4)
#error "kmeans_gpu.cl: TM and TN must be multiples of 4"
#endif

typedef KM_CAT(ACC, 4) ACC4;

__kernel void kmeans_pack(__global const T *centers, const int k, const int d, const int kpad, const int dpad,
                          __global T *ct, __global T *cn)
{
    const int c = get_global_id(0);
    if (c >= kpad) return;
    ACC norm = 0;
    for (int f = 0; f < dpad; ++f) {
        const ACC v = (c < k && f < d) ? (ACC)centers[(long)c * d + f] : (ACC)0;
        ct[(long)f * kpad + c] = v;
        norm += v * v;
    }
    cn[c] = c < k ? norm : KM_INF;
}

#define TILE_VALUES (BK * LXS + BK * LCS)
#define FOLD_VALUES (BM * TX)

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void kmeans_assign(__global const T *x, const long x_off, const int n, const int d, const long row0,
                   __global const T *shift, __global const T *ct, __global const T *cn, const int kpad,
                   __global const T *centers, __global int *labels, __global T *dist,
                   __global int *changed, const int count_changes)
{
    // declared as vectors so the float4 views below are aligned
    __local ACC4 tiles4[(TILE_VALUES > FOLD_VALUES ? TILE_VALUES : FOLD_VALUES) / 4];
    __local int fold_idx[BM * TX];
    __local ACC *tiles = (__local ACC *)tiles4;
    __local int nchanged[1];
    __local ACC *xs = tiles;              // BK x LXS: xs[f * LXS + r] = x[m0 + r, f0 + f] - shift
    __local ACC *cs = tiles + BK * LXS;   // BK x LCS: cs[f * LCS + j] = ct[f0 + f, c0 + j]
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * TX + tx;
    const long m0 = (long)get_group_id(0) * BM;

    ACC best[TM];
    int best_idx[TM];
    for (int i = 0; i < TM; ++i) {
        best[i] = KM_INF;
        best_idx[i] = 0;
    }
    if (tid == 0) nchanged[0] = 0;

    for (int c0 = 0; c0 < kpad; c0 += BN) {
        ACC acc[TM][TN];
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) acc[i][j] = 0;
        for (int f0 = 0; f0 < d; f0 += BK) {
            barrier(CLK_LOCAL_MEM_FENCE);
            // rows past n repeat the last row (their results are dropped); features past d read as 0
            for (int e = tid; e < BM * BK; e += NT) {
                const int r = e / BK, f = e % BK;
                const long row = min(m0 + r, (long)n - 1);
                const int ff = f0 + f;
                xs[f * LXS + r] = ff < d ? (ACC)x[x_off + row * d + ff] - (ACC)shift[ff] : (ACC)0;
            }
            for (int e = tid; e < BK * BN / 4; e += NT) {
                const int f = e / (BN / 4), j = 4 * (e % (BN / 4));
                *(__local ACC4 *)(cs + f * LCS + j) = vload4(0, ct + (long)(f0 + f) * kpad + c0 + j);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int f = 0; f < BK; ++f) {
                ACC a[TM], b[TN];
                for (int g = 0; g < TM / 4; ++g) {
                    const ACC4 v = *(__local const ACC4 *)(xs + f * LXS + ty * 4 + g * TY * 4);
                    a[4 * g] = v.s0; a[4 * g + 1] = v.s1; a[4 * g + 2] = v.s2; a[4 * g + 3] = v.s3;
                }
                for (int g = 0; g < TN / 4; ++g) {
                    const ACC4 v = *(__local const ACC4 *)(cs + f * LCS + tx * 4 + g * TX * 4);
                    b[4 * g] = v.s0; b[4 * g + 1] = v.s1; b[4 * g + 2] = v.s2; b[4 * g + 3] = v.s3;
                }
                for (int i = 0; i < TM; ++i)
                    for (int j = 0; j < TN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
            }
        }
        // fold this tile's candidates, in increasing center order, into the running minimum
        for (int j = 0; j < TN; ++j) {
            const int c = c0 + tx * 4 + (j / 4) * TX * 4 + (j % 4);
            const ACC norm = cn[c];
            for (int i = 0; i < TM; ++i) {
                const ACC v = norm - (ACC)2 * acc[i][j];
                if (v < best[i]) {
                    best[i] = v;
                    best_idx[i] = c;
                }
            }
        }
    }

    // fold across the TX work-items of each row: the smallest value, then the smallest index
    barrier(CLK_LOCAL_MEM_FENCE);
    __local ACC *fold = tiles;  // BM x TX
    for (int i = 0; i < TM; ++i) {
        const int r = ty * 4 + (i / 4) * TY * 4 + (i % 4);
        fold[r * TX + tx] = best[i];
        fold_idx[r * TX + tx] = best_idx[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = tid; r < BM; r += NT) {
        ACC v = fold[r * TX];
        int c = fold_idx[r * TX];
        for (int t = 1; t < TX; ++t) {
            const ACC vt = fold[r * TX + t];
            const int ct_ = fold_idx[r * TX + t];
            if (vt < v || (vt == v && ct_ < c)) {
                v = vt;
                c = ct_;
            }
        }
        fold_idx[r * TX] = c;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // exact distance of each row to its center: work-item (tx, ty) sums features tx, tx + TX, ... of
    // rows ty, ty + TY, ...
    for (int r = ty; r < BM; r += TY) {
        const long row = min(m0 + r, (long)n - 1);
        const int c = fold_idx[r * TX];
        ACC s = 0;
        for (int f = tx; f < d; f += TX) {
            const ACC diff = ((ACC)x[x_off + row * d + f] - (ACC)shift[f]) - (ACC)centers[(long)c * d + f];
            s += diff * diff;
        }
        fold[r * TX + tx] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int mine = 0;
    for (int r = tid; r < BM; r += NT) {
        const long row = m0 + r;
        if (row >= n) continue;
        ACC s = 0;
        for (int t = 0; t < TX; ++t) s += fold[r * TX + t];
        const int c = fold_idx[r * TX];
        if (count_changes && labels[row0 + row] != c) ++mine;
        labels[row0 + row] = c;
        dist[row0 + row] = s;
    }
    if (count_changes) {
        if (mine) atomic_add(nchanged, mine);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tid == 0 && nchanged[0]) atomic_add(changed, nchanged[0]);
    }
}

__kernel __attribute__((reqd_work_group_size(WGU, 1, 1)))
void kmeans_update(__global const T *x, const long x_off, const int n, const int d, const long row0,
                   __global const T *shift, __global const int *labels, __global const T *dist,
                   __global const T *w, const long seg, const long first_seg, const int k, const int nkc,
                   __global ACC *psum, __global ACC *pw, __global ACC *pin)
{
    __local ACC acc[KC * WGU];
    __local ACC wacc[KC];
    __local int labs[WGU];
    __local ACC wts[WGU];
    __local ACC dd[WGU];
    const int lid = get_local_id(0);
    const long s = first_seg + get_group_id(0);
    const int cc = get_group_id(1);
    const int c0 = cc * KC;
    const int kc = min(KC, k - c0);
    const int f = get_group_id(2) * WGU + lid;
    const bool first_f = get_group_id(2) == 0;
    __global ACC *psum_s = psum + ((long)s * k + c0) * d;

    for (int j = 0; j < kc; ++j) acc[j * WGU + lid] = f < d ? psum_s[(long)j * d + f] : (ACC)0;
    for (int j = lid; j < kc; j += WGU) wacc[j] = first_f ? pw[(long)s * k + c0 + j] : (ACC)0;
    ACC inertia = (lid == 0 && first_f) ? pin[s * nkc + cc] : (ACC)0;

    const long lo = max(s * seg, row0);
    const long hi = min((s + 1) * seg, row0 + n);
    for (long b = lo; b < hi; b += WGU) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (b + lid < hi) {
            labs[lid] = labels[b + lid] - c0;
            wts[lid] = KM_WEIGHT(w, b + lid);
            dd[lid] = dist[b + lid];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int cnt = (int)min((long)WGU, hi - b);
        for (int j = 0; j < cnt; ++j) {
            const int lab = labs[j];
            if (lab < 0 || lab >= kc) continue;  // the same for the whole work-group
            const ACC wt = wts[j];
            if (f < d)
                acc[lab * WGU + lid] += wt * ((ACC)x[x_off + (b + j - row0) * d + f] - (ACC)shift[f]);
            if (lid == 0 && first_f) {
                wacc[lab] += wt;
                inertia += wt * dd[j];
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (f < d)
        for (int j = 0; j < kc; ++j) psum_s[(long)j * d + f] = acc[j * WGU + lid];
    if (first_f) {
        for (int j = lid; j < kc; j += WGU) pw[(long)s * k + c0 + j] = wacc[j];
        if (lid == 0) pin[s * nkc + cc] = inertia;
    }
}
