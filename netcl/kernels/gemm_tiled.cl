// Tiled GEMM for GPUs: C = epilogue(A @ B), see gemm_common.cl.
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

#include "gemm_common.cl"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TX
#define TX 16
#endif
#ifndef TY
#define TY 16
#endif
#ifndef VW
#define VW 4
#endif
#ifndef PADA
#define PADA VW
#endif
#ifndef PADB
#define PADB VW
#endif
#ifndef A_TRANS
#define A_TRANS 0
#endif
#ifndef B_TRANS
#define B_TRANS 0
#endif

#define NT (TX * TY)
#define TM (BM / TY)
#define TN (BN / TX)
#define LA ((BM * BK + NT - 1) / NT)   // A elements each work-item stages per tile
#define LB ((BK * BN + NT - 1) / NT)   // B elements each work-item stages per tile
#define LDA_L ((BM + PADA) / VW)       // local row length of the A tile, in vectors
#define LDB_L ((BN + PADB) / VW)

#if VW == 1
typedef ACC_T VEC_T;
#define UNPACK(v, arr, at) (arr)[at] = (v)
#else
typedef GEMM_CAT(ACC, VW) VEC_T;
#if VW == 2
#define UNPACK(v, arr, at) do { (arr)[(at)] = (v).s0; (arr)[(at) + 1] = (v).s1; } while (0)
#elif VW == 4
#define UNPACK(v, arr, at) do { (arr)[(at)] = (v).s0; (arr)[(at) + 1] = (v).s1; \
                                (arr)[(at) + 2] = (v).s2; (arr)[(at) + 3] = (v).s3; } while (0)
#elif VW == 8
#define UNPACK(v, arr, at) do { (arr)[(at)] = (v).s0; (arr)[(at) + 1] = (v).s1; \
                                (arr)[(at) + 2] = (v).s2; (arr)[(at) + 3] = (v).s3; \
                                (arr)[(at) + 4] = (v).s4; (arr)[(at) + 5] = (v).s5; \
                                (arr)[(at) + 6] = (v).s6; (arr)[(at) + 7] = (v).s7; } while (0)
#endif
#endif

#ifndef GM
#define GM 0
#endif
#ifndef KU
#define KU BK          /* unroll of the k loop over a local tile (BK: fully) */
#endif
#define GEMM_PRAGMA(x) _Pragma(#x)
#define GEMM_UNROLL(n) GEMM_PRAGMA(unroll n)
#if !defined(WX) || WX == 0
#undef WX
#define WX TX
#endif
#if WX != TX && ((NT % 32) || (TX % WX) || (32 % WX) || (TY % (32 / WX)))
#error "gemm_tiled: WX must divide TX and 32, and 32/WX must divide TY (work-group a multiple of 32)"
#endif

#if (BM % (TY * VW)) || (BN % (TX * VW)) || (PADA % VW) || (PADB % VW)
#error "gemm_tiled: BM must be a multiple of TY*VW, BN of TX*VW, and PADA/PADB multiples of VW"
#endif

#if defined(GVEC) && (defined(IS_HALF) || (BM % 4) || (BN % 4) || (BK % 4))
#undef GVEC   /* vector fetch needs whole float4s in every tile dimension (and 4-byte+ elements) */
#endif
#ifdef GVEC
#define LA4 ((BM * BK / 4 + NT - 1) / NT)   // 4-wide A loads each work-item issues per tile
#define LB4 ((BK * BN / 4 + NT - 1) / NT)
#define RA_N (LA > 4 * LA4 ? LA : 4 * LA4)
#define RB_N (LB > 4 * LB4 ? LB : 4 * LB4)
#define GLOAD4(off, p) (*(__global const ACC4 *)((p) + (off)))   /* host guarantees alignment */
#if ((BM + PADA) % 4) == 0 && VW >= 4
#define LSTORE4_A(v, at) (*(__local ACC4 *)(as_ + (at)) = (v))
#else
#define LSTORE4_A(v, at) do { as_[(at)] = (v).s0; as_[(at) + 1] = (v).s1; as_[(at) + 2] = (v).s2; \
                              as_[(at) + 3] = (v).s3; } while (0)
#endif
#if ((BN + PADB) % 4) == 0 && VW >= 4
#define LSTORE4_B(v, at) (*(__local ACC4 *)(bs_ + (at)) = (v))
#else
#define LSTORE4_B(v, at) do { bs_[(at)] = (v).s0; bs_[(at) + 1] = (v).s1; bs_[(at) + 2] = (v).s2; \
                              bs_[(at) + 3] = (v).s3; } while (0)
#endif
// 4-wide coordinates of load q (q-th float4 of the tile): the contiguous dimension varies fastest.
#if A_TRANS
#define A_VEC_COORDS(q, mm, kk) const int mm = 4 * ((q) % (BM / 4)), kk = (q) / (BM / 4)
#else
#define A_VEC_COORDS(q, mm, kk) const int kk = 4 * ((q) % (BK / 4)), mm = (q) / (BK / 4)
#endif
#if B_TRANS
#define B_VEC_COORDS(q, nn, kk) const int kk = 4 * ((q) % (BK / 4)), nn = (q) / (BK / 4)
#else
#define B_VEC_COORDS(q, nn, kk) const int nn = 4 * ((q) % (BN / 4)), kk = (q) / (BN / 4)
#endif

// Interior tile at k0: every work-item loads its float4s (no bounds checks).
#define GEMM_TILED_FETCH_VEC(k0)                                                                    \
    do {                                                                                            \
        _Pragma("unroll") for (int i = 0; i < LA4; ++i) {                                           \
            const int q = tid + i * NT;                                                             \
            A_VEC_COORDS(q, mm, kk);                                                                \
            if (q < BM * BK / 4) {                                                                  \
                const ACC4 v_ = GLOAD4(A_OFFSET((long)(m0 + mm), (k0) + kk), A);                    \
                ra[4 * i] = v_.s0; ra[4 * i + 1] = v_.s1; ra[4 * i + 2] = v_.s2; ra[4 * i + 3] = v_.s3; \
            }                                                                                       \
        }                                                                                           \
        _Pragma("unroll") for (int i = 0; i < LB4; ++i) {                                           \
            const int q = tid + i * NT;                                                             \
            B_VEC_COORDS(q, nn, kk);                                                                \
            if (q < BK * BN / 4) {                                                                  \
                const ACC4 v_ = GLOAD4(B_OFFSET((long)((k0) + kk), n0 + nn), B);                    \
                rb[4 * i] = v_.s0; rb[4 * i + 1] = v_.s1; rb[4 * i + 2] = v_.s2; rb[4 * i + 3] = v_.s3; \
            }                                                                                       \
        }                                                                                           \
    } while (0)

#define GEMM_TILED_STAGE_VEC(As_, Bs_)                                                              \
    do {                                                                                            \
        __local ACC_T *as_ = (__local ACC_T *)(As_);                                                \
        __local ACC_T *bs_ = (__local ACC_T *)(Bs_);                                                \
        _Pragma("unroll") for (int i = 0; i < LA4; ++i) {                                           \
            const int q = tid + i * NT;                                                             \
            A_VEC_COORDS(q, mm, kk);                                                                \
            if (q < BM * BK / 4) {                                                                  \
                if (A_TRANS) {                                                                      \
                    LSTORE4_A(((ACC4)(ra[4 * i], ra[4 * i + 1], ra[4 * i + 2], ra[4 * i + 3])),      \
                              kk * (LDA_L * VW) + mm);                                              \
                } else {                                                                            \
                    as_[(kk + 0) * (LDA_L * VW) + mm] = ra[4 * i];                                  \
                    as_[(kk + 1) * (LDA_L * VW) + mm] = ra[4 * i + 1];                              \
                    as_[(kk + 2) * (LDA_L * VW) + mm] = ra[4 * i + 2];                              \
                    as_[(kk + 3) * (LDA_L * VW) + mm] = ra[4 * i + 3];                              \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        _Pragma("unroll") for (int i = 0; i < LB4; ++i) {                                           \
            const int q = tid + i * NT;                                                             \
            B_VEC_COORDS(q, nn, kk);                                                                \
            if (q < BK * BN / 4) {                                                                  \
                if (!B_TRANS) {                                                                     \
                    LSTORE4_B(((ACC4)(rb[4 * i], rb[4 * i + 1], rb[4 * i + 2], rb[4 * i + 3])),      \
                              kk * (LDB_L * VW) + nn);                                              \
                } else {                                                                            \
                    bs_[(kk + 0) * (LDB_L * VW) + nn] = rb[4 * i];                                  \
                    bs_[(kk + 1) * (LDB_L * VW) + nn] = rb[4 * i + 1];                              \
                    bs_[(kk + 2) * (LDB_L * VW) + nn] = rb[4 * i + 2];                              \
                    bs_[(kk + 3) * (LDB_L * VW) + nn] = rb[4 * i + 3];                              \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    } while (0)
#else
#define RA_N LA
#define RB_N LB
#endif

// Fetch this work-item's share of the A and B tiles starting at k0 into registers ra, rb (zero outside).
// Macros rather than functions: the register arrays must never be addressed through a pointer.
#if A_TRANS
#define A_TILE_COORDS(e, mm, kk) const int mm = (e) % BM, kk = (e) / BM   /* neighbours: consecutive m */
#define A_OFFSET(m, k) ((m) + (k) * a_ks)                                 /* a_rs == 1 */
#else
#define A_TILE_COORDS(e, mm, kk) const int kk = (e) % BK, mm = (e) / BK   /* neighbours: consecutive k */
#define A_OFFSET(m, k) ((m) * a_rs + (k))                                 /* a_ks == 1 */
#endif
#if B_TRANS
#define B_TILE_COORDS(e, nn, kk) const int kk = (e) % BK, nn = (e) / BK
#define B_OFFSET(k, n) ((k) + (n) * b_ns)                                 /* b_ks == 1 */
#else
#define B_TILE_COORDS(e, nn, kk) const int nn = (e) % BN, kk = (e) / BN
#define B_OFFSET(k, n) ((k) * b_ks + (n))                                 /* b_ns == 1 */
#endif

#define GEMM_TILED_FETCH(k0)                                                                        \
    do {                                                                                            \
        _Pragma("unroll") for (int i = 0; i < LA; ++i) {                                            \
            const int e = tid + i * NT;                                                             \
            A_TILE_COORDS(e, mm, kk);                                                               \
            const int m = m0 + mm, k = (k0) + kk;                                                   \
            ra[i] = (e < BM * BK && m < M && k < K) ? (ACC_T)LOAD1(A_OFFSET((long)m, k), A) : (ACC_T)0; \
        }                                                                                           \
        _Pragma("unroll") for (int i = 0; i < LB; ++i) {                                            \
            const int e = tid + i * NT;                                                             \
            B_TILE_COORDS(e, nn, kk);                                                               \
            const int n = n0 + nn, k = (k0) + kk;                                                   \
            rb[i] = (e < BK * BN && n < N && k < K) ? (ACC_T)LOAD1(B_OFFSET((long)k, n), B) : (ACC_T)0; \
        }                                                                                           \
    } while (0)

// Store the fetched registers into local tiles As, Bs (k-major: [k][m] and [k][n]).
#define GEMM_TILED_STAGE(As_, Bs_)                                                                  \
    do {                                                                                            \
        __local ACC_T *as_ = (__local ACC_T *)(As_);                                                \
        __local ACC_T *bs_ = (__local ACC_T *)(Bs_);                                                \
        _Pragma("unroll") for (int i = 0; i < LA; ++i) {                                            \
            const int e = tid + i * NT;                                                             \
            A_TILE_COORDS(e, mm, kk);                                                               \
            if (e < BM * BK) as_[kk * (LDA_L * VW) + mm] = ra[i];                                   \
        }                                                                                           \
        _Pragma("unroll") for (int i = 0; i < LB; ++i) {                                            \
            const int e = tid + i * NT;                                                             \
            B_TILE_COORDS(e, nn, kk);                                                               \
            if (e < BK * BN) bs_[kk * (LDB_L * VW) + nn] = rb[i];                                   \
        }                                                                                           \
    } while (0)

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm_tiled(GEMM_ARGS)
{
    __local VEC_T As[2 * BK * LDA_L];
    __local VEC_T Bs[2 * BK * LDB_L];
    const int tid = get_local_id(1) * TX + get_local_id(0);   // linear id: drives the tile fetch
#if WX == TX
    const int tx = get_local_id(0), ty = get_local_id(1);
#else
    // compute position: each group of 32 consecutive work-items covers a WX x (32/WX) patch of
    // the TX x TY grid, so one warp reads fewer distinct local-memory vectors per k step
    const int lane = tid % 32, warp = tid / 32;
    const int tx = (warp % (TX / WX)) * WX + lane % WX, ty = (warp / (TX / WX)) * (32 / WX) + lane / WX;
#endif
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

    ACC_T ra[RA_N], rb[RB_N];   // this work-item's share of the next tile (scalar or 4-wide fetch)
    const int ntiles = (K + BK - 1) / BK;
#if defined(GVEC) && defined(ALL_INNER)
    // the host saw that BM | M, BN | N and BK | K: every tile is interior, no scalar path at all
    GEMM_TILED_FETCH_VEC(0);
    GEMM_TILED_STAGE_VEC(As, Bs);
    if (0)
#elif defined(GVEC)
    const bool inner = m0 + BM <= M && n0 + BN <= N;   // uniform per work-group
    bool vec = inner && BK <= K;                        // tile 0 fetched 4-wide
    if (vec) {
        GEMM_TILED_FETCH_VEC(0);
        GEMM_TILED_STAGE_VEC(As, Bs);
    } else
#endif
    {
        GEMM_TILED_FETCH(0);
        GEMM_TILED_STAGE(As, Bs);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
#if defined(GVEC) && defined(ALL_INNER)
        const bool vec = t + 1 < ntiles;
        if (vec)
            GEMM_TILED_FETCH_VEC((t + 1) * BK);
#elif defined(GVEC)
        vec = inner && (t + 2) * BK <= K;   // tile t+1 lies wholly inside
        if (vec)
            GEMM_TILED_FETCH_VEC((t + 1) * BK);
        else
#endif
#if !(defined(GVEC) && defined(ALL_INNER))
        if (t + 1 < ntiles)
            GEMM_TILED_FETCH((t + 1) * BK);
#endif
        __local const VEC_T *as = As + cur * (BK * LDA_L);
        __local const VEC_T *bs = Bs + cur * (BK * LDB_L);
        GEMM_UNROLL(KU)
        for (int kk = 0; kk < BK; ++kk) {
            ACC_T a[TM], b[TN];
#pragma unroll
            for (int ci = 0; ci < TM / VW; ++ci) {
                const VEC_T v = as[kk * LDA_L + ci * TY + ty];
                UNPACK(v, a, ci * VW);
            }
#pragma unroll
            for (int cj = 0; cj < TN / VW; ++cj) {
                const VEC_T v = bs[kk * LDB_L + cj * TX + tx];
                UNPACK(v, b, cj * VW);
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
#ifdef GVEC
        if (vec)
            GEMM_TILED_STAGE_VEC(As + (cur ^ 1) * (BK * LDA_L), Bs + (cur ^ 1) * (BK * LDB_L));
#ifndef ALL_INNER
        else
#endif
#endif
#if !(defined(GVEC) && defined(ALL_INNER))
        if (t + 1 < ntiles)
            GEMM_TILED_STAGE(As + (cur ^ 1) * (BK * LDA_L), Bs + (cur ^ 1) * (BK * LDB_L));
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / VW) * (TY * VW) + ty * VW + (i % VW);
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + (j / VW) * (TX * VW) + tx * VW + (j % VW);
            if (n < N) STORE1(GEMM_EPILOGUE(acc[i][j], m, n), m * c_rs + n, C);
        }
    }
}
