// What the matrix-unit GEMMs share (gemm_mma.cl's mma.sync tiles, gemm_wgmma.cl's wgmma tiles): the block
// a work-group computes (MMA_BLOCK), and its accumulators: both hold C as mma's 16 x 8 fragments, lane
// (g = lane / 4, t = lane % 4) owning (g, 2t..2t+1) and (g + 8, 2t..2t+1) of each, in float
// acc[MT][NT][4], zeroed by MMA_ACC_ZERO and stored by MMA_STORE_ACC with the fused epilogue of
// gemm_common.cl (or, with C_ACC, the raw float sums: split-K's workspace).

#ifndef GROUP_M
#define GROUP_M 0
#endif
// const int m0, n0: the first row and column of this work-group's BM x BN block of C, and the operands
// moved to its batch. GROUP_M > 1: blocks in column-major groups of GROUP_M block rows, so that
// work-groups that run together share A's rows and B's columns in L2 (launch order is row-major)
#if GROUP_M > 1
#define MMA_BLOCK()                                                                                     \
    int bn_ = get_group_id(0), bm_ = get_group_id(1);                                                  \
    {                                                                                                   \
        const int nbn = get_num_groups(0), nbm = get_num_groups(1);                                     \
        const int pid = bm_ * nbn + bn_, per_group = GROUP_M * nbn, first = (pid / per_group) * GROUP_M; \
        const int rows = min(nbm - first, GROUP_M), in_group = pid % per_group;                         \
        bm_ = first + in_group % rows;                                                                  \
        bn_ = in_group / rows;                                                                          \
    }                                                                                                   \
    const int n0 = bn_ * BN, m0 = bm_ * BM;                                                             \
    GEMM_SELECT_BATCH(get_group_id(2))
#else
#define MMA_BLOCK()                                                                                     \
    const int n0 = get_group_id(0) * BN, m0 = get_group_id(1) * BM;                                     \
    GEMM_SELECT_BATCH(get_group_id(2))
#endif

#define MMA_ACC_ZERO()                                                                                  \
    float acc[MT][NT][4];                                                                               \
    _Pragma("unroll")                                                                                   \
    for (int i = 0; i < MT; ++i)                                                                        \
        _Pragma("unroll")                                                                               \
        for (int j = 0; j < NT; ++j)                                                                    \
            _Pragma("unroll")                                                                           \
            for (int o = 0; o < 4; ++o) acc[i][j][o] = 0.0f

#if defined(C_ACC)
#define STORE_PAIR(v0, v1, p) vstore2((float2)((v0), (v1)), 0, p)
#elif defined(IS_BF16)
#define STORE_PAIR(v0, v1, p) (*(__global ushort2 *)(p) = (ushort2)(nc_float_to_bf16(v0), nc_float_to_bf16(v1)))
#elif defined(IS_HALF)
#define STORE_PAIR(v0, v1, p) (*(__global uint *)(p) = (uint)nc_f2h(v0) | ((uint)nc_f2h(v1) << 16))
#else
#define STORE_PAIR(v0, v1, p) vstore2((float2)((v0), (v1)), 0, p)
#endif

#if defined(C_ACC)
// split-K's workspace: the raw float sums (gemm_reduce_splits adds the slices and applies the epilogue)
#define C_VALUE(v, m, n) (v)
#define STORE_C(v, i, p) ((p)[i] = (v))
#else
#define C_VALUE(v, m, n) GEMM_EPILOGUE((ACC_T)(v), m, n)
#define STORE_C(v, i, p) STORE1(v, i, p)
#endif

#ifdef SPLIT_LAST
#define MMA_FOR_EACH(ROW0, MSTEP, COL0, body)                                                           \
    _Pragma("unroll")                                                                                   \
    for (int i = 0; i < MT; ++i)                                                                        \
        _Pragma("unroll")                                                                               \
        for (int j = 0; j < NT; ++j)                                                                    \
            _Pragma("unroll")                                                                           \
            for (int o = 0; o < 4; ++o) {                                                               \
                const int m = m0 + (ROW0) + i * (MSTEP) + g + (o >> 1) * 8;                             \
                const int n = n0 + (COL0) + j * 8 + 2 * t + (o & 1);                                    \
                if (m < M && n < N) { body; }                                                           \
            }
// every work-group's raw sums to its slice of the workspace; the block's last one (the others return) sums
// the slices into acc, a slice at a time (gemm_common.cl), and stores them through the epilogue
#define MMA_SPLIT_PUT(ROW0, MSTEP, COL0)                                                                \
    MMA_FOR_EACH(ROW0, MSTEP, COL0, SPLIT_PUT(acc[i][j][o], m, n));                                     \
    if (!SPLIT_ARRIVE()) return;                                                                        \
    MMA_FOR_EACH(ROW0, MSTEP, COL0, acc[i][j][o] = 0.0f);                                               \
    for (int s = 0; s < get_num_groups(2); ++s)                                                         \
        MMA_FOR_EACH(ROW0, MSTEP, COL0, acc[i][j][o] += SPLIT_GET(s, m, n))
#else
#define MMA_SPLIT_PUT(ROW0, MSTEP, COL0)
#endif

// Fragment (i, j) of this lane covers C rows m0 + ROW0 + i * MSTEP + g (+ 8) and columns
// n0 + COL0 + 8 j + 2t (+ 1); each lane holds pairs of neighbours (n, n + 1), n even: one 2-element store
// where C's rows allow. Needs M, N, C, c_rs, m0, n0, g, t, acc, MT, NT in scope (SPLIT_LAST: work,
// arrivals, split_last_ too; the work-groups that are not their block's last return).
#define MMA_STORE_ACC(ROW0, MSTEP, COL0)                                                                \
    do {                                                                                                \
        MMA_SPLIT_PUT(ROW0, MSTEP, COL0);                                                               \
        const bool pairs_ = (((ulong)C) % (2 * sizeof(C_T))) == 0 && (c_rs % 2) == 0;                  \
        _Pragma("unroll")                                                                               \
        for (int i = 0; i < MT; ++i)                                                                    \
            _Pragma("unroll")                                                                           \
            for (int j = 0; j < NT; ++j)                                                                \
                _Pragma("unroll")                                                                       \
                for (int h = 0; h < 2; ++h) {                                                           \
                    const int m = m0 + (ROW0) + i * (MSTEP) + g + h * 8, n = n0 + (COL0) + j * 8 + 2 * t; \
                    if (m >= M || n >= N) continue;                                                     \
                    __global C_T *p = C + (long)m * c_rs + n;                                           \
                    const ACC_T v0 = C_VALUE(acc[i][j][2 * h], m, n);                                   \
                    if (n + 1 < N) {                                                                    \
                        const ACC_T v1 = C_VALUE(acc[i][j][2 * h + 1], m, n + 1);                       \
                        if (pairs_) STORE_PAIR(v0, v1, p);                                              \
                        else { STORE_C(v0, 0, p); STORE_C(v1, 1, p); }                                  \
                    } else {                                                                            \
                        STORE_C(v0, 0, p);                                                              \
                    }                                                                                   \
                }                                                                                       \
    } while (0)
