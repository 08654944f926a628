// k-means for GPUs: the assignment step as the tiled GEMM's block with an arg-min epilogue, and the partial
// sums of the update step. Data layout and shift: kmeans_common.cl.
//
// kmeans_pack: the centers (k x d, row-major, centred) transposed into ct (dpad x kpad, feature-major,
// zero-padded) and their squared norms cn (kpad; +inf for the padding, which so never wins).
//
// kmeans_assign: label[i] = argmin_c ||x_i - c||^2 (the first on ties, as scikit-learn), computed as
// argmin_c (||c||^2 - 2 x_i.c); dist[i] = the exact ||x_i - c_label||^2 of the winner. No n x k buffer.
// It is gemm_tiled.cl's block (gemm_tile.cl, gemm_tiled_loop.cl) with A = the rows x (n x d, row-major,
// minus shift as they are staged) and B = ct (d x kpad): a work-group owns BM rows and walks every center
// tile of BN centers, each as NKT k tiles of BK features (one double-buffered stream of tiles, so the next
// center tile's first slice is fetched while the last one's products run). Each work-item keeps its TM x TN
// register tile of dot products (rows ty*VW + g*TY*VW + v, centers tx*VW + g*TX*VW + v); after a center
// tile's last k tile it folds its TN candidates, in increasing center order, into a running (min, index)
// per row held in registers, and zeroes the tile. The final fold across the TX work-items of a row breaks
// ties by index, so the result is the first minimum, as the other variants give. The exact distance of the
// winner is then summed by the TX work-items of the row (features tx, tx + TX, ...), and the labels that
// changed are counted (one atomic per work-group) when count_changes is set. Rows past n repeat the last
// row in 4-wide fetches (GEMM_A_ROW) and read as zero in guarded ones; their results are dropped.
// The dot products are summed feature by feature in order (one mad chain per row and center), as before
// this kernel took the GEMM's block: the same bits on one device, run to run.
// Layout: local (TX, TY), global (ceil(n/BM) * TX, TY).
// Reads x, shift, ct, cn, centers (and labels); writes labels, dist, changed.
// Local memory: the larger of the GEMM's tiles, 2 * BK * ((BM + PADA) + (BN + PADB)) values, and the fold's
// BM * TX values and ints, which reuse the tiles' space after the loop's last barrier.
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
// Knobs: the assignment's tile is gemm_tiled.cl's (BM, BN, BK, TX, TY, VW, PADA, PADB, WX; GVEC and
// ALL_INNER set by the host: 4-wide fetches when x's offset and d are multiples of 4, and no guarded path
// when BK divides d as well); NKT = ceil(d / BK), k tiles per center tile (set by the host). WGU (work-items
// of kmeans_update = features per work-group, default 64), KC (clusters per kmeans_update work-group,
// default 128).

#include "kmeans_common.cl"

// the GEMM block's hooks: rows past n repeat the last row; features are centred as they are staged; half
// data (X_HALF, X_BF16) is converted to float as it is fetched (4-wide: 8-byte aligned, as the host ensures)
#define GEMM_A_ROW(m) min((m), (long)M - 1)
#define GEMM_A_LOAD(i) XLOAD(A, i)
#if defined(X_HALF)
#define GEMM_A_LOAD4(i) nc_ldh4(A + (i))
#elif defined(X_BF16)
#define GEMM_A_LOAD4(i) as_float4(convert_uint4(*(__global const ushort4 *)(A + (i))) << 16)
#endif
#define GEMM_A_MAP(v, k) ((v) - (ACC_T)shift[k])
#define GEMM_A_MAP4(v, k) ((v) - vload4(0, shift + (k)))
#include "gemm_tile.cl"

#if A_TRANS || B_TRANS
#error "kmeans_gpu.cl: x is read row-major and ct feature-major (A_TRANS = B_TRANS = 0)"
#endif
#ifndef NKT
#define NKT 1
#endif
#ifndef WGU
#define WGU 64
#endif
#ifndef KC
#define KC 128
#endif

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


#define KM_TILE_VECS (2 * BK * (LDA_L + LDB_L))
#define KM_FOLD_VECS ((BM * TX * (sizeof(ACC_T) + sizeof(int)) + sizeof(VEC_T) - 1) / sizeof(VEC_T))
#define KM_LOCAL_VECS (KM_TILE_VECS > KM_FOLD_VECS ? KM_TILE_VECS : KM_FOLD_VECS)

// row of the block (0 .. BM-1) of a work-item's register-tile row i, as gemm_tiled.cl stores it
#define KM_ROW(i) (((i) / VW) * (TY * VW) + ty * VW + ((i) % VW))

// after the last k tile of a center tile: fold its candidates into the running minimum, zero the tile
#define KM_FOLD_TILE(t)                                                                             \
    if ((t) % NKT == NKT - 1) {                                                                     \
        const int nb_ = TILE_N0(t);                                                                 \
        _Pragma("unroll") for (int j = 0; j < TN; ++j) {                                            \
            const int c = nb_ + (j / VW) * (TX * VW) + tx * VW + (j % VW);                          \
            const ACC_T norm = (ACC_T)cn[c];                                                        \
            _Pragma("unroll") for (int i = 0; i < TM; ++i) {                                        \
                const ACC_T v = norm - (ACC_T)2 * acc[i][j];                                        \
                if (v < best[i]) {                                                                  \
                    best[i] = v;                                                                    \
                    best_idx[i] = c;                                                                \
                }                                                                                   \
                acc[i][j] = 0;                                                                      \
            }                                                                                       \
        }                                                                                           \
    }

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void kmeans_assign(__global const XT *x, const long x_off, const int n, const int d, const long row0,
                   __global const T *shift, __global const T *ct, __global const T *cn, const int kpad,
                   __global const T *centers, __global int *labels, __global T *dist,
                   __global int *changed, const int count_changes)
{
    // one area: the GEMM's double-buffered tiles during the loop, the fold's values and indices after it
    __local VEC_T tiles[KM_LOCAL_VECS];
    __local VEC_T *As = tiles;
    __local VEC_T *Bs = tiles + 2 * BK * LDA_L;
    __local ACC_T *fold = (__local ACC_T *)tiles;              // BM x TX
    __local int *fold_idx = (__local int *)(fold + BM * TX);  // BM x TX
    __local int nchanged[1];
    // the GEMM's names: A = the rows (M x K, row-major), B = the packed centers (K x N, feature-major)
    __global const XT *A = x + x_off;
    __global const STORE_T *B = ct;
    const int M = n, N = kpad, K = d;
    const long a_rs = d, b_ks = kpad;
    const int tid = get_local_id(1) * TX + get_local_id(0);
    const int tx = GEMM_TILED_TX(tid), ty = GEMM_TILED_TY(tid);
    const int m0 = get_group_id(0) * BM;

    ACC_T best[TM];
    int best_idx[TM];
    ACC_T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        best[i] = KM_INF;
        best_idx[i] = 0;
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0;
    }
    if (tid == 0) nchanged[0] = 0;

#define GEMM_NTILES (NKT * (kpad / BN))
#define TILE_K0(t) (((t) % NKT) * BK)
#define TILE_N0(t) (((t) / NKT) * BN)
#define TILE_VEC(t) ((t) < ntiles && TILE_K0(t) + BK <= K)
#define TILE_DONE(t) KM_FOLD_TILE(t)
#include "gemm_tiled_loop.cl"

    // fold across the TX work-items of each row: the smallest value, then the smallest index
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TM; ++i) {
        const int r = KM_ROW(i);
        fold[r * TX + tx] = best[i];
        fold_idx[r * TX + tx] = best_idx[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    KM_FINISH_BLOCK(TX, NT);
}

__kernel __attribute__((reqd_work_group_size(WGU, 1, 1)))
void kmeans_update(__global const XT *x, const long x_off, const int n, const int d, const long row0,
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
                acc[lab * WGU + lid] += wt * (XLOAD(x, x_off + (b + j - row0) * d + f) - (ACC)shift[f]);
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
