// What the matrix-unit attention kernels share (attention_mma.cl: float16 / bfloat16 on mma.sync and wgmma;
// attention_tf32.cl: float32 on mma.sync's TF32 units, three products a block): the probabilities'
// exponentials, the accumulators of 8-column blocks (mma.sync's layout: a lane holds rows g and g + 8,
// columns 2t and 2t + 1 of each block), the masks and dropout of a tile of scores in that layout, the quad
// shuffles of the row statistics and the cp.async groups. The includer has included attention_common.cl and
// mma_sync.cl, and names `t`, `j0`, `L`, `SQ`, `causal`, `mask`, `mbase`, `mask_si`, `mask_sj`, `row0` and
// the dropout arguments where it uses MASK_ROWS / DROP_ROWS (NB: the 8-key blocks of a tile; MASK_COLS:
// `jloc`, `i0`), and `shx`,
// `tid` where it emulates the shuffles.
#ifndef NETCL_ATTENTION_FRAG_CL
#define NETCL_ATTENTION_FRAG_CL

#if defined(NATIVE_EXP) && !defined(MMA_EMULATE)
// ex2.approx with flush to zero: one MUFU.EX2 (native_exp keeps denormal results, which costs a range check,
// two multiplies and a select per value); a probability below 2^-126 of a row whose largest is 1 is zero to
// the float32 sums it enters
inline float nc_exp2_ftz(const float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
#define EXP2F(x) nc_exp2_ftz(x)
#define EXPF(x) nc_exp2_ftz((x) * LOG2E)
#elif defined(NATIVE_EXP)
#define EXP2F(x) native_exp2(x)
#define EXPF(x) native_exp(x)
#else
#define EXP2F(x) exp2(x)
#define EXPF(x) exp(x)
#endif
#define LOG2E 1.4426950408889634f

// EXP_FUSED 1: the forward's and dq's probabilities as exp2(s c - m log2 e) in one multiply-add from the
// unscaled scores of an unmasked tile (c = scale log2 e), FlashAttention-2's form: no scaling pass, no -inf
// test a score (a masked score is -inf, which exp2 takes to 0; a row that saw nothing yet subtracts 0)
#ifndef EXP_FUSED
#define EXP_FUSED 1
#endif


// acc[0..N)[0..4) = 0 (accumulators of N 8-column blocks)
#define ZERO_ACC(acc, N)                                                                                \
    _Pragma("unroll")                                                                                   \
    for (int z_ = 0; z_ < (N); ++z_) acc[z_][0] = acc[z_][1] = acc[z_][2] = acc[z_][3] = 0.0f

// acc[0..N)[0..4) *= x
#define SCALE_ACC(acc, N, x)                                                                            \
    _Pragma("unroll")                                                                                   \
    for (int z_ = 0; z_ < (N); ++z_) {                                                                  \
        acc[z_][0] *= (x); acc[z_][1] *= (x); acc[z_][2] *= (x); acc[z_][3] *= (x);                     \
    }

// whether every query row i0.. of a tile may see every key j0 .. j0 + n - 1 (no mask, all keys valid, below
// the causal edge): then no pair of the tile is masked
inline bool open_tile(const int j0, const int n, const int i0, const int L, const int SQ, const int causal) {
    return MASK == MASK_NONE && j0 + n <= L && (!causal || j0 + n - 1 <= i0 + L - SQ);
}

// The masks of a tile of scores s[NB][4] (query rows irow[r], keys j0 + jb * 8 + 2t + (e & 1): the forward's
// and the dq pass's layout), for tiles that have masked pairs: outside the hot path, which stays one
// straight block without branches
#define MASK_ROWS(s, irow)                                                                              \
    _Pragma("unroll")                                                                                   \
    for (int jb = 0; jb < NB; ++jb)                                                                     \
        _Pragma("unroll")                                                                               \
        for (int e = 0; e < 4; ++e) {                                                                   \
            const int r_ = e >> 1, j_ = j0 + jb * 8 + 2 * t + (e & 1);                                  \
            s[jb][e] = masked_score(s[jb][e], irow[r_], j_, L, SQ, causal, mask,                        \
                                    mbase + irow[r_] * mask_si + j_ * mask_sj);                         \
        }
// The masks of a tile of transposed scores s[NQB][4] (the dk/dv passes' layout: keys j0 + jloc[e >> 1] the
// rows, queries i0 + jb * 8 + 2t + (e & 1) the columns, clamped to the last row for the mask's index), for
// tiles that have masked pairs
#define MASK_COLS(s, NQB)                                                                               \
    _Pragma("unroll")                                                                                   \
    for (int jb = 0; jb < (NQB); ++jb)                                                                  \
        _Pragma("unroll")                                                                               \
        for (int e = 0; e < 4; ++e) {                                                                   \
            const int j_ = j0 + jloc[e >> 1], i_ = min(i0 + jb * 8 + 2 * t + (e & 1), SQ - 1);          \
            s[jb][e] = masked_score(s[jb][e], i_, j_, L, SQ, causal, mask, mbase + i_ * mask_si + j_ * mask_sj); \
        }
// The dk/dv passes' query tiles of bq rows for the keys from j0: the first row that may see key j0 (causal:
// bottom-right aligned) rounded down to a tile, and how many tiles from there (none for keys at or past L)
inline int query_start(const int causal, const int j0, const int L, const int SQ, const int bq) {
    return causal ? max(0, j0 - L + SQ) / bq * bq : 0;
}
inline int query_tiles(const int istart, const int j0, const int L, const int SQ, const int bq) {
    return j0 < L && SQ > istart ? (SQ - istart + bq - 1) / bq : 0;
}
// target[jb][e] *= dropout's multiplier of the pair where p[jb][e] != 0 (the same layout; rows row0 + rloc[r])
#define DROP_ROWS(target, p, rloc)                                                                      \
    _Pragma("unroll")                                                                                   \
    for (int jb = 0; jb < NB; ++jb)                                                                     \
        _Pragma("unroll")                                                                               \
        for (int e = 0; e < 4; ++e)                                                                     \
            if (p[jb][e] != 0.0f)                                                                       \
                target[jb][e] *= dropout_one(counter0, row0 + rloc[e >> 1], j0 + jb * 8 + 2 * t + (e & 1),  \
                                             seed_lo, seed_hi, drop_threshold, drop_scale)

// the value of lane (this lane ^ m) of the warp (m < 32)
#ifdef MMA_EMULATE
#define SHFL_XOR(v, m) shfl_xor_local(v, m, shx, tid)
inline float shfl_xor_local(const float v, const int m, __local float *shx, const int tid) {
    shx[tid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float r = shx[tid ^ m];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#else
#define SHFL_XOR(v, m) shfl_xor_sync(v, m)
inline float shfl_xor_sync(const float v, const int m) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(m));
    return r;
}
#endif
#define QUAD_MAX(x) do { x = fmax(x, SHFL_XOR(x, 1)); x = fmax(x, SHFL_XOR(x, 2)); } while (0)
#define QUAD_SUM(x) do { x += SHFL_XOR(x, 1); x += SHFL_XOR(x, 2); } while (0)

#ifdef MMA_EMULATE
#define CP_COMMIT()
#define CP_WAIT1()
#define CP_WAIT0()
#else
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_WAIT1() asm volatile("cp.async.wait_group 1;" ::: "memory")   // all but the newest group landed
#define CP_WAIT0() asm volatile("cp.async.wait_group 0;" ::: "memory")   // every group landed
#endif

#endif
