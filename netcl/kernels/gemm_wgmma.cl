// GEMM on Hopper's warpgroup matrix units (wgmma.mma_async, PTX sm_90a) from OpenCL C. NVIDIA's OpenCL
// compiler targets plain sm_90 and its ptxas refuses sm_90a instructions, so they are written behind the
// comment prefix "//NCWG " (NCW below): the compiler passes inline asm through with its operands filled
// in, and netcl.kernels.ptx uncomments them and raises the PTX's target to sm_90a before the driver
// builds the program from that PTX (bench/wgmma_probe.py is the probe that showed this works). float16 /
// bfloat16 inputs (m64nBNk16, either operand K- or MN-major) or TF32 from float32 inputs (m64nBNk8, both
// K-major), float32 accumulation, the epilogue of gemm_common.cl (gemm_fragments.cl).
//
// Work layout: a work-group of WGS warpgroups (128 work-items each) computes a BM x BN block of C; warpgroup
// w the rows w * BM / WGS .. as MT = BM / WGS / 64 wgmmas of 64 x BN per k step, accumulators in registers
// (acc[MT][BN / 8][4], mma's 16 x 8 fragment layout per warp: gemm_fragments.cl). K is walked in tiles of
// BK through a ring of WSTAGES local stages filled by cp.async (16 bytes a work-item; zero-fill at the
// edges): tile kt + WSTAGES - 1 is in flight while the matrix units read tile kt straight from local
// memory through descriptors (no fragments in registers, no ldmatrix).
//
// Local tiles are the canonical wgmma layouts: a K-major operand (A with K contiguous, or B stored N x K)
// as rows of BK elements (ROWB = 32, 64 or 128 bytes: the swizzle width), 8-row groups ROWB * 8 apart
// (SBO); an MN-major one (A stored K x M, B stored K x N) as blocks of 64 elements (128 bytes) along M or N,
// each block BK rows, blocks BK * 128 bytes apart (LBO), 8-row groups 1024 apart (SBO). Both swizzled:
// the 16-byte chunk at byte L lives at L ^ (((L >> 7) & (W / 16 - 1)) << 4), W the swizzle width, which
// the hardware undoes; every tile starts 1024-byte aligned.
//
// Defines: MMA_F16 | MMA_BF16 | MMA_TF32, BM, BN (64, 128 or 256), BK, WSTAGES, WGS, WPIPE (0: each tile's
// wgmmas finish before the next tile's barrier; 1: one batch stays in flight), A_MN (A stored K x M),
// B_MN (B stored K x N), TF32_ROUND (1: float32 tiles rounded to TF32 in local memory; 0: the matrix units
// truncate, as cuBLAS's TF32 mode does), EPI_SMEM (below), GROUP_M (as gemm_mma.cl), SPLIT_KT (split-K's
// whole K where the slices do not divide it: K is each slice's length, the last one shorter), MMA_EMULATE (wgmma
// computed from the same local tiles by address arithmetic, cp.async as a copy: the layouts and edges
// testable on any OpenCL device, e.g. PoCL and Oclgrind).

#include "gemm_common.cl"
#include "gemm_fragments.cl"
#include "wgmma.cl"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WSTAGES
#define WSTAGES 3
#endif
#ifndef WGS
#define WGS 1
#endif
#ifndef WPIPE
#define WPIPE 0
#endif
#ifndef TF32_ROUND
#define TF32_ROUND 1
#endif
// tiles in flight ahead of the one the matrix units read: WPIPE=1 keeps one wgmma batch running across
// the next tile's barrier, so the stage two tiles back is the one refilled (one tile less of prefetch)
#define LEAD (WSTAGES - 1 - WPIPE)
#if LEAD < 1 || WPIPE < 0 || WPIPE > 1
#error "WPIPE is 0 or 1, and WSTAGES - 1 - WPIPE tiles ahead must be at least one"
#endif
#ifdef A_MN
#define TRANS_A 1
#else
#define TRANS_A 0
#endif
#ifdef B_MN
#define TRANS_B 1
#else
#define TRANS_B 0
#endif

#if defined(MMA_TF32)
#define ESZ 4
#define KSTEP 8
#if defined(A_MN) || defined(B_MN)
#error "TF32 wgmma takes K-major operands only"
#endif
#else
#define ESZ 2
#define KSTEP 16
#endif
#define VEC (16 / ESZ)          // elements per 16-byte chunk
#define ROWB (BK * ESZ)         // bytes of a K-major tile row: the swizzle width
#define MNE (128 / ESZ)         // elements per 128-byte block of an MN-major tile
#define THREADS (WGS * 128)
#define WG_ROWS (BM / WGS)
#define MT (WG_ROWS / 64)
#define NT (BN / 8)
#define A_BYTES (BM * ROWB)
#define B_BYTES (BN * ROWB)
#define STAGE_BYTES (A_BYTES + B_BYTES)
#if (ROWB != 32 && ROWB != 64 && ROWB != 128) || (WG_ROWS % 64) || (BN != 64 && BN != 128 && BN != 256)
#error "wgmma tiles: BK of 32, 64 or 128 bytes, BM / WGS a multiple of 64, BN 64, 128 or 256"
#endif
#if (defined(A_MN) && (BM % MNE)) || (defined(B_MN) && (BN % MNE)) || (BK % 8)
#error "MN-major tiles: BM, BN multiples of 64 elements; BK a multiple of 8"
#endif
#if ((BM * BK / VEC) % THREADS) || ((BN * BK / VEC) % THREADS) || (A_BYTES % 1024)
#error "16-byte chunks of the BM x BK and BN x BK tiles must divide evenly among the work-items"
#endif

// byte offsets in a tile: K-major element (row r, k) and MN-major element (mn, k)
inline uint kmajor_byte(const int r, const int k) { return swizzle(r * ROWB + k * ESZ, ROWB); }
inline uint mnmajor_byte(const int mn, const int k) {
    return swizzle((mn / MNE) * (BK * 128) + k * 128 + (mn % MNE) * ESZ, 128);
}

#define MN_LBO (BK * 128)     // MN-major: LBO = the 128-byte blocks' stride, SBO = 8 k rows (the H200 probe)
#define MN_SBO 1024
// k step kk of m tile `row0` (A) and of B, in a stage at local address `a_at` / `b_at`: K-major tiles move
// 32 bytes along their rows (inside the swizzle row), MN-major ones KSTEP rows of 128 bytes
#ifdef A_MN
#define DESC_A(a_at, row0, kk) wg_desc((a_at) + ((row0) / MNE) * (BK * 128) + (kk) * KSTEP * 128, MN_LBO, MN_SBO, 1)
#else
#define DESC_A(a_at, row0, kk) wg_desc((a_at) + (row0) * ROWB + (kk) * 32, 16, 8 * ROWB, SWZ_MODE(ROWB))
#endif
#ifdef B_MN
#define DESC_B(b_at, kk) wg_desc((b_at) + (kk) * KSTEP * 128, MN_LBO, MN_SBO, 1)
#else
#define DESC_B(b_at, kk) wg_desc((b_at) + (kk) * 32, 16, 8 * ROWB, SWZ_MODE(ROWB))
#endif


#ifdef MMA_EMULATE
inline float wg_value(__local const uchar *p) {
#if defined(MMA_TF32)
    return as_float(*(__local const uint *)p & 0xffffe000u);  // the units' truncation (a no-op after ROUND_TF32)
#elif defined(MMA_BF16)
    return as_float(((uint)*(__local const ushort *)p) << 16);
#else
    return vload_half(0, (__local const half *)p);
#endif
}
// One operand element as the matrix units find it: decode the descriptor (start address, LBO, SBO, swizzle
// width; addresses are offsets in `tiles`, whose 1024-byte alignment the swizzle assumes) and read element
// (row, k) of the k step, row along M or N: K-major at row / 8 * SBO + row % 8 * width + k * ESZ, MN-major
// at row / 64 * LBO + k / 8 * SBO + k % 8 * 128 + row % 64 * ESZ (16-bit elements), then swizzled.
inline float wg_operand(__local const uchar *tiles, const ulong desc, const int row, const int k,
                        const int mn_major) {
    const uint start = (uint)(desc & 0x3fffu) << 4, lbo = (uint)((desc >> 16) & 0x3fffu) << 4;
    const uint sbo = (uint)((desc >> 32) & 0x3fffu) << 4, mode = (uint)(desc >> 62);
    const uint w = mode == 1 ? 128 : mode == 2 ? 64 : 32;
    const uint at = mn_major ? start + (row / MNE) * lbo + (k / 8) * sbo + (k % 8) * 128 + (row % MNE) * ESZ
                             : start + (row / 8) * sbo + (row % 8) * w + k * ESZ;
    return wg_value(tiles + swizzle(at, w));
}
// acc += the 64 x BN x KSTEP product one wgmma computes from descriptors da, db, each lane for its own
// fragments (the same descriptors the real instruction gets: their fields are tested here too)
inline void wg_emulate(float acc[NT][4], __local const uchar *tiles, const ulong da, const ulong db,
                       const int wq, const int g, const int t) {
    for (int j = 0; j < NT; ++j)
        for (int q = 0; q < 4; ++q) {
            const int r = wq * 16 + g + 8 * (q >> 1), c = 8 * j + 2 * t + (q & 1);
            float s = acc[j][q];
            for (int k = 0; k < KSTEP; ++k)
                s += wg_operand(tiles, da, r, k, TRANS_A) * wg_operand(tiles, db, c, k, TRANS_B);
            acc[j][q] = s;
        }
}
#define CP_ASYNC(dst, src, bytes)                                                                       \
    do {                                                                                                \
        uint4 v_ = (uint4)(0);                                                                          \
        if ((bytes) == 16) v_ = vload4(0, (__global const uint *)(src));                                \
        else if ((bytes) > 0) {                                                                         \
            uint w_[4] = {0, 0, 0, 0};                                                                  \
            for (int e_ = 0; e_ < (bytes) / 2; ++e_)                                                    \
                w_[e_ >> 1] |= (uint)((__global const ushort *)(src))[e_] << (16 * (e_ & 1));          \
            v_ = (uint4)(w_[0], w_[1], w_[2], w_[3]);                                                   \
        }                                                                                               \
        *(__local uint4 *)(dst) = v_;                                                                   \
    } while (0)
#define CP_COMMIT()
#define CP_WAIT()
#define WG_WAIT(n)
#else
#define CP_ASYNC(dst, src, bytes)                                                                       \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"                                        \
                 :: "r"((uint)(ulong)(dst)), "l"((ulong)(src)), "r"(bytes) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_WAIT() asm volatile("cp.async.wait_group " WG_STR(LEAD - 1) ";" ::: "memory")
// until at most n wgmma batches are in flight; the wait names every accumulator as written (and an empty
// asm each further m tile's): no read of them may move above it
#define WG_WAIT(n)                                                                                      \
    do {                                                                                                \
        asm volatile(NCW("wgmma.wait_group.sync.aligned " WG_STR(n) ";") : WG_OPS(0) :: "memory");     \
        _Pragma("unroll")                                                                               \
        for (int i_ = 1; i_ < MT; ++i_) asm volatile("" : WG_OPS(i_) :: "memory");                     \
    } while (0)
#endif

// the accumulator operands of one m64nBN wgmma (acc[m][0..NT-1][0..3], in register order)
#define WG_OPS4(m, j) "+f"(acc[m][j][0]), "+f"(acc[m][j][1]), "+f"(acc[m][j][2]), "+f"(acc[m][j][3])
#define WG_REGS_N64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define WG_DESC_N64 "%32, %33, p"
#define WG_PRED_N64 "%34"
#define WG_OPS_N64(m) WG_OPS4(m, 0), WG_OPS4(m, 1), WG_OPS4(m, 2), WG_OPS4(m, 3), WG_OPS4(m, 4), WG_OPS4(m, 5), WG_OPS4(m, 6), WG_OPS4(m, 7)
#define WG_REGS_N128 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define WG_DESC_N128 "%64, %65, p"
#define WG_PRED_N128 "%66"
#define WG_OPS_N128(m) WG_OPS4(m, 0), WG_OPS4(m, 1), WG_OPS4(m, 2), WG_OPS4(m, 3), WG_OPS4(m, 4), WG_OPS4(m, 5), WG_OPS4(m, 6), WG_OPS4(m, 7), WG_OPS4(m, 8), WG_OPS4(m, 9), WG_OPS4(m, 10), WG_OPS4(m, 11), WG_OPS4(m, 12), WG_OPS4(m, 13), WG_OPS4(m, 14), WG_OPS4(m, 15)
#define WG_REGS_N256 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define WG_DESC_N256 "%128, %129, p"
#define WG_PRED_N256 "%130"
#define WG_OPS_N256(m) WG_OPS4(m, 0), WG_OPS4(m, 1), WG_OPS4(m, 2), WG_OPS4(m, 3), WG_OPS4(m, 4), WG_OPS4(m, 5), WG_OPS4(m, 6), WG_OPS4(m, 7), WG_OPS4(m, 8), WG_OPS4(m, 9), WG_OPS4(m, 10), WG_OPS4(m, 11), WG_OPS4(m, 12), WG_OPS4(m, 13), WG_OPS4(m, 14), WG_OPS4(m, 15), WG_OPS4(m, 16), WG_OPS4(m, 17), WG_OPS4(m, 18), WG_OPS4(m, 19), WG_OPS4(m, 20), WG_OPS4(m, 21), WG_OPS4(m, 22), WG_OPS4(m, 23), WG_OPS4(m, 24), WG_OPS4(m, 25), WG_OPS4(m, 26), WG_OPS4(m, 27), WG_OPS4(m, 28), WG_OPS4(m, 29), WG_OPS4(m, 30), WG_OPS4(m, 31)

#define WG_REGS WG_CAT(WG_REGS_N, BN)
#define WG_DESC WG_CAT(WG_DESC_N, BN)
#define WG_PRED WG_CAT(WG_PRED_N, BN)
#define WG_OPS(m) WG_CAT(WG_OPS_N, BN)(m)
#define WG_CAT2(a, b) a##b
#define WG_CAT(a, b) WG_CAT2(a, b)
#if defined(MMA_TF32)
#define WG_SHAPE "wgmma.mma_async.sync.aligned.m64n" WG_STR(BN) "k8.f32.tf32.tf32 "
#define WG_IMM ", 1, 1;"
#elif defined(MMA_BF16)
#define WG_SHAPE "wgmma.mma_async.sync.aligned.m64n" WG_STR(BN) "k16.f32.bf16.bf16 "
#define WG_IMM ", 1, 1, " WG_STR(TRANS_A) ", " WG_STR(TRANS_B) ";"
#else
#define WG_SHAPE "wgmma.mma_async.sync.aligned.m64n" WG_STR(BN) "k16.f32.f16.f16 "
#define WG_IMM ", 1, 1, " WG_STR(TRANS_A) ", " WG_STR(TRANS_B) ";"
#endif
// wgmma i (m tile) of k step kk on the stage at byte `at`: A's tile at base + at, B's at base + at + A_BYTES
#ifdef MMA_EMULATE
#define WGMMA(i, at, kk)                                                                                \
    wg_emulate(acc[i], tiles, DESC_A(base + (at), (i) * 64 + wg * WG_ROWS, kk),                         \
               DESC_B(base + A_BYTES + (at), kk), wq, g, t)
#else
// scale-d = 1 always: the accumulators start at zero
#define WGMMA(i, at, kk)                                                                                \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, " WG_PRED ", 0; " WG_SHAPE WG_REGS ", " WG_DESC WG_IMM " }") \
                 : WG_OPS(i)                                                                            \
                 : "l"(DESC_A(base + (at), (i) * 64 + wg * WG_ROWS, kk)),                              \
                   "l"(DESC_B(base + A_BYTES + (at), kk)),                                              \
                   "r"(1) : "memory")
#endif

#if defined(MMA_TF32)
// to TF32 (nearest, ties away from zero) in place, four float32 bit patterns at a time
#ifdef MMA_EMULATE
#define RNA4(v) (((v) + (uint4)(0x1000u)) & (uint4)(0xffffe000u))
#else
inline uint rna1(const uint x) {
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(as_float(x)));
    return r;
}
#define RNA4(v) ((uint4)(rna1((v).s0), rna1((v).s1), rna1((v).s2), rna1((v).s3)))
#endif
#endif

// EPI_SMEM 1: float16 / bfloat16 C leaves through local memory: each lane's accumulator pairs (the fused
// epilogue applied, rounded to T) into a BM x (BN + 8) tile over the stages, then whole 16-byte pieces of its
// rows to C (the direct stores write 4 bytes a lane: a warp's store covers 8 rows of 16 bytes). Interior
// blocks of a C whose rows start on 16-byte boundaries; edge blocks store directly. Same bits either way.
#ifndef EPI_SMEM
#define EPI_SMEM 0
#endif
#define EPI_LD (BN + 8)     // a row of the C tile in local memory, 16-bit values (a 16-byte pad: no conflicts)
// (a tile whose stages cannot hold C, e.g. two stages of 128 x 128 x 32, stores directly)
#if EPI_SMEM && !defined(C_ACC) && !defined(SPLIT_LAST) && (defined(IS_BF16) || defined(IS_HALF)) && \
    BM * EPI_LD * 2 <= WSTAGES * STAGE_BYTES
#if defined(IS_BF16)
#define EPI_PAIR(v0, v1) ((uint)nc_float_to_bf16(v0) | ((uint)nc_float_to_bf16(v1) << 16))
#else
#define EPI_PAIR(v0, v1) ((uint)nc_f2h(v0) | ((uint)nc_f2h(v1) << 16))
#endif
#define EPI_STAGED 1
#endif
// ... and float32 C (split-K's partial sums, C_ACC, or a TF32 product's float32 output) 64 rows at a time
// (BM x BN floats do not fit the stages): rows of BN + 4 floats, then 16-byte pieces of them to C. H200, the
// 25M GPT's bfloat16 weight gradients: the direct stores' 8-byte pieces wrote the slices at ~1.3 TB/s
// (a 128-block launch of 8 k-tiles took 6 us longer into 8 MB of float32 slices than into bfloat16 C)
#define EPI_LD32 (BN + 4)
#if EPI_SMEM && !defined(SPLIT_LAST) && (defined(C_ACC) || !(defined(IS_BF16) || defined(IS_HALF))) && \
    64 * EPI_LD32 * 4 <= WSTAGES * STAGE_BYTES
#define EPI_STAGED32 1
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void gemm_mma(GEMM_ARGS)
{
    // one region: stage s holds A at s * STAGE_BYTES, B at s * STAGE_BYTES + A_BYTES (each 1024-aligned)
    __local uchar tiles[WSTAGES * STAGE_BYTES] __attribute__((aligned(1024)));
    __local uchar *const As = tiles, *const Bs = tiles + A_BYTES;
    GEMM_SPLIT_LOCAL;
#ifdef MMA_EMULATE
    const uint base = 0;                         // descriptors address `tiles` by offset
#else
    const uint base = (uint)(ulong)tiles;        // the shared window address of the tiles
#endif
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, t = lane & 3;
    MMA_BLOCK();
    MMA_ACC_ZERO();
#ifdef SPLIT_KT
    // split-K whose slices do not divide K (SPLIT_KT, the whole K): slice z starts z K on, the last covers
    // only what is left
    const int k_slice = min(K, SPLIT_KT - (int)get_group_id(2) * K);
#define K k_slice
#endif

    // Each work-item's 16-byte chunks keep their place from tile to tile: sources, destinations and edge
    // limits are set up once. K-major chunks: (row, k chunk), `lim` the elements left in the row from
    // k0 = 0 (0 past the operand's rows); MN-major chunks: (k row, mn chunk), `lim` the elements left along
    // M or N, `kr` the chunk's k row (valid while k0 + kr < K).
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
    __global const STORE_T *src_a[CH_A], *src_b[CH_B];
    uint dst_a[CH_A], dst_b[CH_B];
    int lim_a[CH_A], lim_b[CH_B], kr_a[CH_A], kr_b[CH_B];
    #pragma unroll
    for (int h = 0; h < CH_A; ++h) {
        const int idx = tid + h * THREADS;
#ifdef A_MN
        const int k = idx / (BM / VEC), mc = (idx % (BM / VEC)) * VEC;
        src_a[h] = A + (long)k * a_ks + min(m0 + mc, M - 1);
        dst_a[h] = mnmajor_byte(mc, k);
        lim_a[h] = clamp(M - m0 - mc, 0, VEC);
        kr_a[h] = k;
#else
        const int r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;
        src_a[h] = A + (long)min(m0 + r, M - 1) * a_rs + kc;
        dst_a[h] = kmajor_byte(r, kc);
        lim_a[h] = m0 + r < M ? K - kc : 0;
        kr_a[h] = 0;
#endif
    }
    #pragma unroll
    for (int h = 0; h < CH_B; ++h) {
        const int idx = tid + h * THREADS;
#ifdef B_MN
        const int k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;
        src_b[h] = B + (long)k * b_ks + min(n0 + nc, N - 1);
        dst_b[h] = mnmajor_byte(nc, k);
        lim_b[h] = clamp(N - n0 - nc, 0, VEC);
        kr_b[h] = k;
#else
        const int r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;
        src_b[h] = B + (long)min(n0 + r, N - 1) * b_ns + kc;
        dst_b[h] = kmajor_byte(r, kc);
        lim_b[h] = n0 + r < N ? K - kc : 0;
        kr_b[h] = 0;
#endif
    }
#ifdef A_MN
#define LEFT_A(h, k0) ((k0) + kr_a[h] < K ? lim_a[h] : 0)
#define STEP_A(h, k0) ((long)(k0) * a_ks)
#else
#define LEFT_A(h, k0) min(VEC, lim_a[h] - (k0))
#define STEP_A(h, k0) ((long)(k0))
#endif
#ifdef B_MN
#define LEFT_B(h, k0) ((k0) + kr_b[h] < K ? lim_b[h] : 0)
#define STEP_B(h, k0) ((long)(k0) * b_ks)
#else
#define LEFT_B(h, k0) min(VEC, lim_b[h] - (k0))
#define STEP_B(h, k0) ((long)(k0))
#endif
#define ISSUE(kt)                                                                                       \
    do {                                                                                                \
        const int k0_ = (kt) * BK, at_ = ((kt) % WSTAGES) * STAGE_BYTES;                               \
        _Pragma("unroll")                                                                               \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int left = LEFT_A(h, k0_);                                                            \
            CP_ASYNC(As + at_ + dst_a[h], left > 0 ? src_a[h] + STEP_A(h, k0_) : A, max(left, 0) * ESZ); \
        }                                                                                               \
        _Pragma("unroll")                                                                               \
        for (int h = 0; h < CH_B; ++h) {                                                                \
            const int left = LEFT_B(h, k0_);                                                            \
            CP_ASYNC(Bs + at_ + dst_b[h], left > 0 ? src_b[h] + STEP_B(h, k0_) : B, max(left, 0) * ESZ); \
        }                                                                                               \
    } while (0)

#if defined(MMA_TF32) && TF32_ROUND
    // the matrix units read TF32 from the tiles' float32 bits by truncation: each work-item rounds the
    // chunks it copied (to nearest, ties away: as mma.sync's cvt.rna.tf32.f32) once they have landed
#define ROUND_TF32(at)                                                                                  \
    do {                                                                                                \
        _Pragma("unroll")                                                                               \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            __local uint4 *p_ = (__local uint4 *)(As + (at) + dst_a[h]);                                \
            *p_ = RNA4(*p_);                                                                            \
        }                                                                                               \
        _Pragma("unroll")                                                                               \
        for (int h = 0; h < CH_B; ++h) {                                                                \
            __local uint4 *p_ = (__local uint4 *)(Bs + (at) + dst_b[h]);                                \
            *p_ = RNA4(*p_);                                                                            \
        }                                                                                               \
    } while (0)
#else
#define ROUND_TF32(at)
#endif

    const int nk = (K + BK - 1) / BK;
    #pragma unroll
    for (int s = 0; s < LEAD; ++s) {
        if (s < nk) ISSUE(s);
        CP_COMMIT();
    }
    for (int kt = 0; kt < nk; ++kt) {
        CP_WAIT();                       // tile kt has landed (this work-item's copies)
        ROUND_TF32((kt % WSTAGES) * STAGE_BYTES);
        FENCE_ASYNC();                   // ... and is visible to the matrix units
        barrier(CLK_LOCAL_MEM_FENCE);    // ... for every work-item; all are done with tile kt - 1 - WPIPE
        if (kt + LEAD < nk) ISSUE(kt + LEAD);   // into the stage tile kt - 1 - WPIPE used
        CP_COMMIT();
        const int at = (kt % WSTAGES) * STAGE_BYTES;
        WG_FENCE();
        #pragma unroll
        for (int kk = 0; kk < BK / KSTEP; ++kk)
            #pragma unroll
            for (int i = 0; i < MT; ++i) WGMMA(i, at, kk);
        WG_COMMIT();
        WG_WAIT(WPIPE);                  // its stage may be refilled once every warpgroup passed here
    }
    WG_WAIT(0);

#ifdef EPI_STAGED
    // the same for every work-item of the group
    if (m0 + BM <= M && n0 + BN <= N && ((ulong)C) % 16 == 0 && c_rs % 8 == 0) {
        __local ushort *const cs = (__local ushort *)tiles;
        barrier(CLK_LOCAL_MEM_FENCE);   // every warpgroup's wgmmas are done with the stages
        #pragma unroll
        for (int i = 0; i < MT; ++i)
            #pragma unroll
            for (int j = 0; j < NT; ++j)
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = wg * WG_ROWS + wq * 16 + i * 64 + g + h * 8, c = j * 8 + 2 * t;
                    *(__local uint *)(cs + r * EPI_LD + c) =
                        EPI_PAIR(C_VALUE(acc[i][j][2 * h], m0 + r, n0 + c),
                                 C_VALUE(acc[i][j][2 * h + 1], m0 + r, n0 + c + 1));
                }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int idx = tid; idx < BM * BN / 8; idx += THREADS) {
            const int r = idx / (BN / 8), c = (idx % (BN / 8)) * 8;
            *(__global uint4 *)(C + (long)(m0 + r) * c_rs + n0 + c) =
                *(__local const uint4 *)(cs + r * EPI_LD + c);
        }
        return;
    }
#endif
#ifdef EPI_STAGED32
    // the same for every work-item of the group
    if (m0 + BM <= M && n0 + BN <= N && ((ulong)C) % 16 == 0 && c_rs % 4 == 0) {
        __local float *const cs = (__local float *)tiles;
        #pragma unroll
        for (int pass = 0; pass < BM / 64; ++pass) {   // rows pass * 64 ..: m tile i of warpgroup wg
            barrier(CLK_LOCAL_MEM_FENCE);   // the stages, or the last pass's rows, are free
            #pragma unroll
            for (int i = 0; i < MT; ++i)
                if (wg * MT + i == pass) {
                    #pragma unroll
                    for (int j = 0; j < NT; ++j)
                        #pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int r = wq * 16 + g + h * 8, c = j * 8 + 2 * t, m = m0 + pass * 64 + r;
                            vstore2((float2)(C_VALUE(acc[i][j][2 * h], m, n0 + c),
                                             C_VALUE(acc[i][j][2 * h + 1], m, n0 + c + 1)),
                                    0, cs + r * EPI_LD32 + c);
                        }
                }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int idx = tid; idx < 64 * BN / 4; idx += THREADS) {
                const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
                vstore4(vload4(0, cs + r * EPI_LD32 + c), 0, C + (long)(m0 + pass * 64 + r) * c_rs + n0 + c);
            }
        }
        return;
    }
#endif
    MMA_STORE_ACC(wg * WG_ROWS + wq * 16, 64, 0);
#ifdef SPLIT_KT
#undef K
#endif
}
