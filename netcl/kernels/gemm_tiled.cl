// Tiled GEMM for GPUs: C = epilogue(A @ B), see gemm_common.cl. The block's tiles and k loop live in
// gemm_tile.cl and gemm_tiled_loop.cl, shared with k-means' assignment (kmeans_gpu.cl).
// Layout: local (TX, TY, 1) work-items, global (ceil(N/BN)*TX, ceil(M/BM)*TY, batch). A work-group
// computes a BM x BN block of C; each work-item a TM x TN register tile (TM = BM/TY, TN = BN/TX) whose
// rows are TM/VW groups of VW consecutive rows spaced TY*VW apart (columns likewise with TX), so the
// vector reads of local memory by neighbouring work-items are contiguous and conflict-free.
// K is walked in tiles of BK: the A (BM x BK) and B (BK x BN) tiles are staged k-major in local memory,
// double-buffered: while the work-group multiplies tile t out of one buffer, each work-item has already
// fetched its share of tile t+1 from global memory into registers, stores it to the other buffer, and one
// barrier per tile separates the phases. Global loads are coalesced along whichever dimension of the
// operand is contiguous: 4-wide on interior tiles when GVEC is set, else scalar with out-of-range rows,
// columns and k read as zero. Results pass the fused epilogue and are written with bound checks.
// Reads A, B (, bias, residual); writes C. Work-group order may be regrouped (GM), warps remapped (WX).
// Local memory: 2 * BK * ((BM + PADA) + (BN + PADB)) accumulator-sized values.
// Tuning knobs:
//   BM, BN   block tile of C per work-group (default 128 x 128)
//   BK       k values per local-memory tile (default 16)
//   TX, TY   work-group shape; TX*TY work-items, each computing (BM/TY) x (BN/TX) (default 16 x 16)
//   VW       vector width of local-memory reads: 1, 2, 4 or 8 (default 4)
//   PADA, PADB  padding (multiples of VW) added to a local row to spread banks (default 4)
//   WX       compute layout: 32 consecutive work-items (one NVIDIA warp) take a WX x (32/WX) patch of
//            the TX x TY grid (default 0 = TX: plain row-major ids)
//   GM       grouped block order for L2 reuse: GM block-rows per group (default 0: row-major order)
//   KU       unroll factor of the k loop over a staged tile (default BK: fully unrolled)
//   INNER    1: when BM | M, BN | N and BK | K (and GVEC), the host defines ALL_INNER and the guarded
//            scalar fetch is not compiled at all (default 0)
// Layout flags (set by the host): A_TRANS=1 when A's rows are contiguous along M (A is a transposed
// view, a_rs == 1), else A's k is contiguous (a_ks == 1); B_TRANS=1 when B's k is contiguous (b_ks == 1),
// else B's columns are (b_ns == 1).
// GVEC (set by the host when every operand offset, non-unit stride and batch stride is a multiple of 4
// elements; float32/float64 only): tiles that lie wholly inside the matrices (m0 + BM <= M, n0 + BN <= N,
// k0 + BK <= K; the decision is uniform per work-group) are fetched with aligned 4-wide global loads
// (float4: one 128-bit load per 4 elements, no bound checks); edge tiles take the scalar guarded path.
// A 4-wide load along k is transposed into the k-major local tile with 4 scalar stores; along m or n it
// is stored as one vector.

#include "gemm_tile.cl"

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm_tiled(GEMM_ARGS)
{
    __local VEC_T As[2 * BK * LDA_L];
    __local VEC_T Bs[2 * BK * LDB_L];
    GEMM_SPLIT_LOCAL;
    const int tid = get_local_id(1) * TX + get_local_id(0);   // linear id: drives the tile fetch
    const int tx = GEMM_TILED_TX(tid), ty = GEMM_TILED_TY(tid);   // compute position
#if GM > 0
    // grouped block order: consecutive work-groups walk GM block-rows down one block-column before
    // moving right, so the blocks resident at one time share A rows and B columns in the L2 cache
    const int npn = get_num_groups(0), npm = get_num_groups(1);
    const int pid = get_group_id(1) * npn + get_group_id(0), width = GM * npn;
    const int first_m = (pid / width) * GM, gsz = min(npm - first_m, GM);
    const int m0 = (first_m + (pid % width) % gsz) * BM, n0 = ((pid % width) / gsz) * BN;
#else
    const int m0 = get_group_id(1) * BM, n0 = get_group_id(0) * BN;
#endif
    GEMM_SELECT_BATCH(get_group_id(2));

    ACC_T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0;

#if defined(GVEC) && !defined(ALL_INNER)
    const bool inner = m0 + BM <= M && n0 + BN <= N;   // uniform per work-group
#endif
#define GEMM_NTILES ((K + BK - 1) / BK)
#define TILE_K0(t) ((t) * BK)
#define TILE_N0(t) n0
#define TILE_VEC(t) (inner && ((t) + 1) * BK <= K)
#define TILE_DONE(t)
#include "gemm_tiled_loop.cl"

#define TILED_FOR_EACH(body)                                                                        \
    _Pragma("unroll")                                                                               \
    for (int i = 0; i < TM; ++i) {                                                                  \
        const int m = m0 + (i / VW) * (TY * VW) + ty * VW + (i % VW);                              \
        if (m >= M) continue;                                                                       \
        _Pragma("unroll")                                                                           \
        for (int j = 0; j < TN; ++j) {                                                              \
            const int n = n0 + (j / VW) * (TX * VW) + tx * VW + (j % VW);                          \
            if (n < N) { body; }                                                                    \
        }                                                                                           \
    }
#ifdef SPLIT_LAST
    // the block's last work-group sums the slices (gemm_common.cl), a slice at a time: its loads fly together
    TILED_FOR_EACH(SPLIT_PUT(acc[i][j], m, n));
    if (!SPLIT_ARRIVE()) return;
    TILED_FOR_EACH(acc[i][j] = 0);
    for (int s = 0; s < get_num_groups(2); ++s) TILED_FOR_EACH(acc[i][j] += SPLIT_GET(s, m, n));
#endif
    TILED_FOR_EACH(STORE1(GEMM_EPILOGUE(acc[i][j], m, n), m * c_rs + n, C));
}
