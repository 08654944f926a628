// Tiled GEMM for GPUs: C = epilogue(A @ B), see gemm_common.cl.
// Layout: local (TX, TY, 1) work-items, global (ceil(N/BN)*TX, ceil(M/BM)*TY, batch). A work-group
// computes a BM x BN block of C; each work-item a TM x TN register tile (TM = BM/TY, TN = BN/TX) whose
// rows are TM/VW groups of VW consecutive rows spaced TY*VW apart (columns likewise with TX), so the
// vector reads of local memory by neighbouring work-items are contiguous and conflict-free.
// K is walked in tiles of BK: the A (BM x BK) and B (BK x BN) tiles are staged k-major in local memory,
// double-buffered: while the work-group multiplies tile t out of one buffer, each work-item has already
// fetched its share of tile t+1 from global memory into registers, stores it to the other buffer, and one
// barrier per tile separates the phases. Global loads are scalar and coalesced along whichever dimension
// of the operand is contiguous; out-of-range rows, columns and k are read as zero. Results pass the fused
// epilogue and are written with bound checks. Reads A, B (, bias, residual); writes C.
// Local memory: 2 * BK * ((BM + PADA) + (BN + PADB)) accumulator-sized values.
// Tuning knobs:
//   BM, BN   block tile of C per work-group (default 128 x 128)
//   BK       k values per local-memory tile (default 16)
//   TX, TY   work-group shape; TX*TY work-items, each computing (BM/TY) x (BN/TX) (default 16 x 16)
//   VW       vector width of local-memory reads: 1, 2, 4 or 8 (default 4)
//   PADA, PADB  padding (multiples of VW) added to a local row to spread banks (default 4)
// Layout flags (set by the host): A_TRANS=1 when A's rows are contiguous along M (A is a transposed
// view, a_rs == 1), else A's k is contiguous (a_ks == 1); B_TRANS=1 when B's k is contiguous (b_ks == 1),
// else B's columns are (b_ns == 1).

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

#if (BM % (TY * VW)) || (BN % (TX * VW)) || (PADA % VW) || (PADB % VW)
#error "gemm_tiled: BM must be a multiple of TY*VW, BN of TX*VW, and PADA/PADB multiples of VW"
#endif

// Fetch this work-item's share of the A and B tiles starting at k0 into registers (zero outside).
inline void gemm_tiled_fetch(const int tid, const int m0, const int n0, const int k0,
                             const int M, const int N, const int K,
                             __global const STORE_T *A, const long a_rs, const long a_ks,
                             __global const STORE_T *B, const long b_ks, const long b_ns,
                             ACC_T *ra, ACC_T *rb)
{
#pragma unroll
    for (int i = 0; i < LA; ++i) {
        const int e = tid + i * NT;
#if A_TRANS
        const int mm = e % BM, kk = e / BM;     // consecutive work-items: consecutive m (contiguous)
#else
        const int kk = e % BK, mm = e / BK;     // consecutive work-items: consecutive k (contiguous)
#endif
        const int m = m0 + mm, k = k0 + kk;
#if A_TRANS
        const long at = m + k * a_ks;           // a_rs == 1
#else
        const long at = m * a_rs + k;           // a_ks == 1
#endif
        ra[i] = (e < BM * BK && m < M && k < K) ? (ACC_T)LOAD1(at, A) : (ACC_T)0;
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
        const int e = tid + i * NT;
#if B_TRANS
        const int kk = e % BK, nn = e / BK;
#else
        const int nn = e % BN, kk = e / BN;
#endif
        const int n = n0 + nn, k = k0 + kk;
#if B_TRANS
        const long at = k + n * b_ns;           // b_ks == 1
#else
        const long at = k * b_ks + n;           // b_ns == 1
#endif
        rb[i] = (e < BK * BN && n < N && k < K) ? (ACC_T)LOAD1(at, B) : (ACC_T)0;
    }
}

// Store the fetched registers into local buffers As, Bs (k-major: [k][m] and [k][n]).
inline void gemm_tiled_stage(const int tid, const ACC_T *ra, const ACC_T *rb,
                             __local ACC_T *As, __local ACC_T *Bs)
{
#pragma unroll
    for (int i = 0; i < LA; ++i) {
        const int e = tid + i * NT;
#if A_TRANS
        const int mm = e % BM, kk = e / BM;
#else
        const int kk = e % BK, mm = e / BK;
#endif
        if (e < BM * BK) As[kk * (LDA_L * VW) + mm] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
        const int e = tid + i * NT;
#if B_TRANS
        const int kk = e % BK, nn = e / BK;
#else
        const int nn = e % BN, kk = e / BN;
#endif
        if (e < BK * BN) Bs[kk * (LDB_L * VW) + nn] = rb[i];
    }
}

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm_tiled(GEMM_ARGS)
{
    __local VEC_T As[2 * BK * LDA_L];
    __local VEC_T Bs[2 * BK * LDB_L];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int tid = ty * TX + tx;
    const int m0 = get_group_id(1) * BM, n0 = get_group_id(0) * BN;
    GEMM_SELECT_BATCH(get_group_id(2));

    ACC_T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0;

    ACC_T ra[LA], rb[LB];
    const int ntiles = (K + BK - 1) / BK;
    gemm_tiled_fetch(tid, m0, n0, 0, M, N, K, A, a_rs, a_ks, B, b_ks, b_ns, ra, rb);
    gemm_tiled_stage(tid, ra, rb, (__local ACC_T *)As, (__local ACC_T *)Bs);
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles)
            gemm_tiled_fetch(tid, m0, n0, (t + 1) * BK, M, N, K, A, a_rs, a_ks, B, b_ks, b_ns, ra, rb);
        __local const VEC_T *as = As + cur * (BK * LDA_L);
        __local const VEC_T *bs = Bs + cur * (BK * LDB_L);
#pragma unroll
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
        if (t + 1 < ntiles)
            gemm_tiled_stage(tid, ra, rb, (__local ACC_T *)(As + (cur ^ 1) * (BK * LDA_L)),
                             (__local ACC_T *)(Bs + (cur ^ 1) * (BK * LDB_L)));
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
