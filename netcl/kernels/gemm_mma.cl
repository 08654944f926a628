// GEMM on NVIDIA's matrix units from OpenCL C: mma.sync through inline PTX (NVIDIA's OpenCL compiler
// accepts it); float16 / bfloat16 inputs (m16n8k16) or TF32 from float32 inputs (m16n8k8), float32
// accumulation, the fused epilogue of gemm_common.cl. No cl_khr_fp16 is needed: half values are only
// moved as 16-bit patterns and multiplied by the matrix units.
//
// Work layout: a work-group of (BM/WM) x (BN/WN) warps computes a BM x BN block of C; each warp a
// WM x WN patch as (WM/16) x (WN/8) mma tiles of 16 x 8, accumulators in registers. K is walked in
// steps of BK: both operands' BM x BK and BN x BK slices are staged in local memory (B transposed,
// k contiguous, as the "col" operand of mma wants), then each warp loads its fragments as 32-bit
// pairs and issues the mma instructions.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 / m16n8k8; g = lane / 4, t = lane % 4):
//   A 16 x 16: a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)   [k16; tf32 k8: a0 (g, t)
//              a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)]
//   B 16 x 8:  b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g)                            [tf32: b0 (t, g) b1 (t+4, g)]
//   C 16 x 8:  c0 c1 (g, 2t..2t+1) c2 c3 (g+8, 2t..2t+1)
//
// ASYNC (with ALIGNED, rows and offsets 16-byte aligned): a ring of STAGES local tiles filled by cp.async
// (sm_80+): the copies of tile k + STAGES - 1 fly while the matrix units work on tile k, without
// registers in between; one barrier per k tile. LDMATRIX: fragments read with ldmatrix.x4 (four 8 x 8
// matrices of 16-bit values per instruction; .trans for the k-major B tile; TF32 A and n-major B as
// 8 x 4 matrices of 32-bit values) instead of one 32-bit local load per register.
//
// Defines: MMA_F16 | MMA_BF16 | MMA_TF32 (input kind), BM, BN, BK (block), WM, WN (warp patch), PAD, PADB
// (local row padding, elements), ASYNC, STAGES (the cp.async ring), SWIZZLE (0/1: XOR-swizzled unpadded
// tiles in the ring instead of padding), LDMATRIX, DBUF (0/1: fragments double-buffered in registers),
// GROUP_M (0: row-major block order; g > 1: column-major in groups of g block rows, for L2 reuse),
// DYN_LOCAL (0/1: tiles in a __local kernel argument `tiles` sized at launch instead of static arrays),
// MMA_EMULATE (run the same fragments through a local-memory emulation of mma: lets the kernel's index
// arithmetic be tested on any OpenCL device, e.g. PoCL and Oclgrind; cp.async becomes a plain copy and
// ldmatrix per-lane address arithmetic), plus the GEMM options of gemm_common.cl. Storage: MMA_F16 = half
// (IS_HALF), MMA_BF16 = bfloat16 bits, MMA_TF32 = float.

#include "gemm_common.cl"
#include "gemm_fragments.cl"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 32
#endif
#ifndef PAD
#define PAD 8
#endif
#ifndef PADB
#define PADB 8
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef SWIZZLE
#define SWIZZLE 0
#endif
#ifndef DBUF
#define DBUF 0
#endif
#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define THREADS (WARPS_M * WARPS_N * 32)
#define MT (WM / 16)
#define NT (WN / 8)
#if (BM % WM) || (BN % WN) || (WM % 16) || (WN % 8)
#error "BM, BN must be multiples of the warp patch WM x WN, WM of 16 and WN of 8"
#endif

#if defined(MMA_TF32)
typedef uint LTYPE;          // one 32-bit element per k
#define KSTEP 8
#define LD (BK + PAD)
inline uint to_lds(__global const STORE_T *p, long i) {
    uint r;
#ifdef MMA_EMULATE
    uint x = as_uint(p[i]);
    r = (x + 0x1000u) & 0xffffe000u;  // round to nearest (ties away), as cvt.rna.tf32.f32
#else
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(p[i]));
#endif
    return r;
}
#else
typedef ushort LTYPE;        // 16-bit patterns, read back in pairs
#define KSTEP 16
#define LD (BK + PAD)
inline ushort to_lds(__global const STORE_T *p, long i) { return ((__global const ushort *)p)[i]; }
#endif

#include "mma_sync.cl"

#if defined(MMA_TF32)
#define VEC 4               // elements per 16-byte chunk (global load, cp.async, ldmatrix row)
#else
#define VEC 8
#endif
#define LDB (BN + PADB)     // row length of the padded k-major B tile (B_KMAJOR)

// Local tile layouts. "Row" tiles hold A (BM rows) and, unless B_KMAJOR, B (BN rows) with k contiguous;
// the k-major B tile holds BK rows of BN. R_OFF(r, k) / K_OFF(k, n): element offsets in a tile.
// Padded (PAD / PADB elements at each row's end): rows LD / LDB long. SWIZZLE (the cp.async ring only):
// rows exactly BK / BN long, and the 16-byte chunk c of row r stored at chunk c ^ swz(r), so that the 8
// rows one ldmatrix phase (or one 128-byte store phase) touches fall on 8 different chunks of the 32 banks
// with no padding: a 128 x 128 x 32 half stage is 16 KB, and three stages fit NVIDIA's 48 KB.
// swz depends on r % 8 only (so fragment addresses are one XOR per lane) and never exceeds the row.
#if defined(ASYNC) && SWIZZLE
#define LDA_T BK            // row length of row tiles in local memory
#define LDB_T BN            // of the k-major B tile
#define CPR (BK / VEC)      // 16-byte chunks per row tile row
#define CPRB (BN / VEC)
#define SWZ_ROWS(c) ((c) >= 8 ? 1 : 8 / (c))
#define SWZ_MOD(c) ((c) >= 8 ? 8 : (c))
#define SWZ_R(r) (((r) / SWZ_ROWS(CPR)) % SWZ_MOD(CPR))
#if defined(MMA_TF32) && CPRB >= 8
// TF32 k-major B is read one 32-bit value a lane (no ldmatrix.trans for 32-bit): rows k..k+3 of one
// instruction need chunk pairs on different banks, hence the XOR by 2 (k % 4)
#define SWZ_K(k) (((((k) & 3) << 1) | (((k) >> 2) & 1)))
#else
#define SWZ_K(k) (((k) / SWZ_ROWS(CPRB)) % SWZ_MOD(CPRB))
#endif
#define R_OFF(r, k) ((r) * BK + (((((k) / VEC) ^ SWZ_R(r))) * VEC) + ((k) % VEC))
#define K_OFF(k, n) ((k) * BN + (((((n) / VEC) ^ SWZ_K(k))) * VEC) + ((n) % VEC))
#if (BK % VEC) || (BN % VEC) || (CPR & (CPR - 1)) || (CPRB & (CPRB - 1))
#error "SWIZZLE needs rows of BK and BN elements holding a power of two of 16-byte chunks"
#endif
#else
#define LDA_T LD
#define LDB_T LDB
#define SWZ_R(r) 0
#define SWZ_K(k) 0
#define R_OFF(r, k) ((r) * LD + (k))
#define K_OFF(k, n) ((k) * LDB + (n))
#endif
#define A_TILE (BM * LDA_T)
#ifdef B_KMAJOR
#define B_TILE (BK * LDB_T)  // B[k0 + k, n0 + c] at K_OFF(k, c) (B's rows contiguous along n)
#else
#define B_TILE (BN * LDA_T)  // B[k0 + k, n0 + c] at R_OFF(c, k) (k contiguous: the mma "col" operand)
#endif

// one 32-bit fragment register from a row tile: TF32 one element, else the pair (k, k + 1), k even
#if defined(MMA_TF32)
#define FRAG(tile, row, k) ((tile)[R_OFF(row, k)])
#else
#define FRAG(tile, row, k) (((__local const uint *)(tile))[R_OFF(row, k) >> 1])
#endif

#ifdef ALIGNED
// 16-byte loads: the operand's contiguous axis has stride 1, and every row start is a multiple of VEC
inline uint4 load_vec(__global const STORE_T *p, const long i, const bool whole, const int left) {
#if defined(MMA_TF32)
    float4 v;
    if (whole) v = vload4(0, p + i);
    else {
        v = (float4)(0.0f);
        if (left > 0) v.s0 = p[i];
        if (left > 1) v.s1 = p[i + 1];
        if (left > 2) v.s2 = p[i + 2];
    }
    uint4 r;
#ifdef MMA_EMULATE
    r = (as_uint4(v) + (uint4)(0x1000u)) & (uint4)(0xffffe000u);
#else
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s0) : "f"(v.s0));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s1) : "f"(v.s1));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s2) : "f"(v.s2));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s3) : "f"(v.s3));
#endif
    return r;
#else
    __global const ushort *q = (__global const ushort *)p + i;
    if (whole) return as_uint4(vload8(0, q));
    ushort8 v = (ushort8)(0);
    if (left > 0) v.s0 = q[0];
    if (left > 1) v.s1 = q[1];
    if (left > 2) v.s2 = q[2];
    if (left > 3) v.s3 = q[3];
    if (left > 4) v.s4 = q[4];
    if (left > 5) v.s5 = q[5];
    if (left > 6) v.s6 = q[6];
    return as_uint4(v);
#endif
}
#endif

#ifdef ASYNC
// one 16-byte copy global -> local; `bytes` < 16 fills the rest with zeros (0: no read at all)
inline void cp_async16(__local LTYPE *dst, __global const STORE_T *src, const int bytes) {
    nc_cp_async16((__local void *)dst, (__global const void *)src, bytes);
}
#define MMA_STR2(x) #x
#define MMA_STR(x) MMA_STR2(x)
#ifdef MMA_EMULATE
#define CP_COMMIT()
#define CP_WAIT()
#else
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_WAIT() asm volatile("cp.async.wait_group " MMA_STR(STAGES - 2) ";" ::: "memory")
#endif
#endif

#if defined(MMA_TF32) && defined(ASYNC)
// tiles hold raw float32 bits (cp.async cannot convert): fragments are rounded to TF32 as they are read
inline uint tf32_frag(uint x) {
#ifdef MMA_EMULATE
    return (x + 0x1000u) & 0xffffe000u;
#else
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(as_float(x)));
    return r;
#endif
}
#define CVT_FRAG(x) tf32_frag(x)
#else
#define CVT_FRAG(x) (x)
#endif

#if defined(LDMATRIX) && defined(MMA_TF32) && !defined(ASYNC)
#undef LDMATRIX             // TF32 tiles of the register loaders may have unaligned padded rows
#endif
#ifdef LDMATRIX
#if (WN % 16)
#error "LDMATRIX takes warp patches WN a multiple of 16"
#endif
#endif

// Row addresses by lane L for ldmatrix.x4 (i: the warp's 16-row A tile, j: its pair of 8-column B tiles,
// kk: the k step; kk / VEC is even, so "+ chunk bit" is "^ chunk bit" and the swizzle folds into one XOR
// per lane): A's 16 rows at chunks kk and kk + VEC; B (n rows) two 8-row tiles at chunks kk, kk + VEC;
// k-major B (.trans) rows kk.. kk + 15, two 8-column chunks.
#define A_ROWS(L) (as + (wm + i * 16 + ((L) & 15)) * LDA_T + ((((kk) / VEC) ^ (((L) >> 4) ^ SWZ_R((L) & 7))) * VEC))
#define B_ROWS(L) (bs + (wn + j * 8 + ((L) >> 4) * 8 + ((L) & 7)) * LDA_T                                  \
                   + ((((kk) / VEC) ^ ((((L) >> 3) & 1) ^ SWZ_R((L) & 7))) * VEC))
#define B_ROWS_KMAJOR(L) (bs + ((kk) + (((L) >> 3) & 1) * 8 + ((L) & 7)) * LDB_T                            \
                          + ((((wn + j * 8) / VEC) ^ (((L) >> 4) ^ SWZ_K((L) & 7))) * VEC))

// the fragments of k step kk (a variable in scope) into a[MT][4], b[NT][2] (tiles `as`, `bs`)
#ifdef LDMATRIX
#define LOAD_A(a)                                                                                   \
    do {                                                                                                \
        MMA_UNROLL                                                                                      \
        for (int i = 0; i < MT; ++i) {                                                                  \
            LDSM(a[i], A_ROWS, false);                                                                  \
            _Pragma("unroll") for (int o_ = 0; o_ < 4; ++o_) a[i][o_] = CVT_FRAG(a[i][o_]);             \
        }                                                                                               \
    } while (0)
#else
#if defined(MMA_TF32)
#define LOAD_A(a)                                                                                   \
    _Pragma("unroll")                                                                                   \
    for (int i = 0; i < MT; ++i) {                                                                      \
        const int r = wm + i * 16 + g;                                                                  \
        a[i][0] = CVT_FRAG(FRAG(as, r, kk + t));      a[i][1] = CVT_FRAG(FRAG(as, r + 8, kk + t));      \
        a[i][2] = CVT_FRAG(FRAG(as, r, kk + t + 4));  a[i][3] = CVT_FRAG(FRAG(as, r + 8, kk + t + 4));  \
    }
#else
#define LOAD_A(a)                                                                                   \
    _Pragma("unroll")                                                                                   \
    for (int i = 0; i < MT; ++i) {                                                                      \
        const int r = wm + i * 16 + g;                                                                  \
        a[i][0] = FRAG(as, r, kk + 2 * t);      a[i][1] = FRAG(as, r + 8, kk + 2 * t);                  \
        a[i][2] = FRAG(as, r, kk + 2 * t + 8);  a[i][3] = FRAG(as, r + 8, kk + 2 * t + 8);              \
    }
#endif
#endif

#if defined(LDMATRIX) && !(defined(B_KMAJOR) && defined(MMA_TF32))
#ifdef B_KMAJOR
#define B_LDSM(r) LDSM(r, B_ROWS_KMAJOR, true)
#else
#define B_LDSM(r) LDSM(r, B_ROWS, false)
#endif
#define LOAD_B(b)                                                                                   \
    MMA_UNROLL                                                                                          \
    for (int j = 0; j < NT; j += 2) {                                                                   \
        uint r_[4];                                                                                     \
        B_LDSM(r_);                                                                                     \
        b[j][0] = CVT_FRAG(r_[0]); b[j][1] = CVT_FRAG(r_[1]);                                           \
        b[j + 1][0] = CVT_FRAG(r_[2]); b[j + 1][1] = CVT_FRAG(r_[3]);                                   \
    }
#else
#if defined(B_KMAJOR) && defined(MMA_TF32)
#define B_PAIR(b, c)                                                                                \
    b[0] = CVT_FRAG(bs[K_OFF(kk + t, c)]);   b[1] = CVT_FRAG(bs[K_OFF(kk + t + 4, c)])
#elif defined(B_KMAJOR)
#define B_PAIR(b, c)                                                                                \
    b[0] = (uint)bs[K_OFF(kk + 2 * t, c)] | ((uint)bs[K_OFF(kk + 2 * t + 1, c)] << 16);                 \
    b[1] = (uint)bs[K_OFF(kk + 2 * t + 8, c)] | ((uint)bs[K_OFF(kk + 2 * t + 9, c)] << 16)
#elif defined(MMA_TF32)
#define B_PAIR(b, c) b[0] = CVT_FRAG(FRAG(bs, c, kk + t));      b[1] = CVT_FRAG(FRAG(bs, c, kk + t + 4))
#else
#define B_PAIR(b, c) b[0] = FRAG(bs, c, kk + 2 * t);      b[1] = FRAG(bs, c, kk + 2 * t + 8)
#endif
#define LOAD_B(b)                                                                                   \
    _Pragma("unroll")                                                                                   \
    for (int j = 0; j < NT; ++j) {                                                                      \
        const int c = wn + j * 8 + g;                                                                   \
        B_PAIR(b[j], c);                                                                            \
    }
#endif

#define MMA_ALL(a, b)                                                                                   \
    MMA_UNROLL                                                                                          \
    for (int i = 0; i < MT; ++i)                                                                        \
        MMA_UNROLL                                                                                      \
        for (int j = 0; j < NT; ++j)                                                                    \
            MMA(acc[i][j], a[i], b[j], acc[i][j])

#ifndef DYN_LOCAL
#define DYN_LOCAL 0
#endif
#ifdef ASYNC
#define RING STAGES
#else
#define RING 1
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
#if DYN_LOCAL
// the tiles in dynamic local memory (a __local argument of RING * (A_TILE + B_TILE) LTYPEs, sized at
// launch): a driver may grant a work-group more of it than of static local memory (NVIDIA: 48 KB)
void gemm_mma(GEMM_ARGS, __local uint4 *tiles)
#else
void gemm_mma(GEMM_ARGS)
#endif
{
    // 16-byte aligned: tiles are written (and, with ASYNC/LDMATRIX, read) 16 bytes at a time
#if DYN_LOCAL
    __local LTYPE *As = (__local LTYPE *)tiles, *Bs = As + RING * A_TILE;
#elif defined(ASYNC)
    __local LTYPE As[STAGES * A_TILE] __attribute__((aligned(16)));  // stage s: A[m0 + r, k0 + k] at s * A_TILE + R_OFF(r, k)
    __local LTYPE Bs[STAGES * B_TILE] __attribute__((aligned(16)));
#else
    __local LTYPE As[A_TILE] __attribute__((aligned(16)));           // A[m0 + r, k0 + k] at R_OFF(r, k)
    __local LTYPE Bs[B_TILE] __attribute__((aligned(16)));
#endif
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS_M * WARPS_N * 16 * KSTEP];
    __local float scratch_b[WARPS_M * WARPS_N * KSTEP * 8];
#endif
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    MMA_BLOCK();
    MMA_ACC_ZERO();

#if (defined(ASYNC) || defined(ALIGNED)) && (((BM * BK) % (VEC * THREADS)) || ((BN * BK) % (VEC * THREADS)))
#error "16-byte chunks of the BM x BK and BK x BN tiles must divide evenly among the work-group's threads"
#endif
#if defined(ASYNC)
    // every 16-byte chunk of a k tile: A's BM x BK, then B's (k-major rows along n, or rows along k). Each
    // thread's chunks keep their rows and columns from tile to tile: sources, destinations and edge
    // tests are set up once; a tile adds k0 (A, B rows along k) or k0 rows (k-major B).
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
    __global const STORE_T *src_a[CH_A], *src_b[CH_B];
    int dst_a[CH_A], dst_b[CH_B], kc_a[CH_A], kc_b[CH_B], lim_a[CH_A], lim_b[CH_B];
    #pragma unroll
    for (int h = 0; h < CH_A; ++h) {
        const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;
        src_a[h] = A + (long)min(m0 + r, M - 1) * a_rs + kc;
        dst_a[h] = R_OFF(r, kc);
        kc_a[h] = kc;
        lim_a[h] = m0 + r < M ? K - kc : 0;     // elements left in the row from k0 = 0
    }
    #pragma unroll
    for (int h = 0; h < CH_B; ++h) {
#ifdef B_KMAJOR
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;
        src_b[h] = B + (long)k * b_ks + min(n0 + nc, N - 1);
        dst_b[h] = K_OFF(k, nc);
        kc_b[h] = k;                            // the chunk's k row: in range while k0 + k < K
        lim_b[h] = max(min(VEC, N - n0 - nc), 0);
#else
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;
        src_b[h] = B + (long)min(n0 + c, N - 1) * b_ns + kc;
        dst_b[h] = R_OFF(c, kc);
        kc_b[h] = kc;
        lim_b[h] = n0 + c < N ? K - kc : 0;
#endif
    }
#define ISSUE(kt)                                                                                       \
    do {                                                                                                \
        const int k0_ = (kt) * BK, s_ = (kt) % STAGES;                                                  \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int left = min(VEC, lim_a[h] - k0_);                                                  \
            cp_async16(&As[s_ * A_TILE + dst_a[h]], left > 0 ? src_a[h] + k0_ : A,                       \
                       max(left, 0) * (int)sizeof(STORE_T));                                            \
        }                                                                                               \
        ISSUE_B(k0_, s_);                                                                               \
    } while (0)
#ifdef B_KMAJOR
#define ISSUE_B(k0_, s_)                                                                                \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int left = k0_ + kc_b[h] < K ? lim_b[h] : 0;                                              \
        cp_async16(&Bs[s_ * B_TILE + dst_b[h]], left > 0 ? src_b[h] + (long)k0_ * b_ks : B,             \
                   left * (int)sizeof(STORE_T));                                                        \
    }
#else
#define ISSUE_B(k0_, s_)                                                                                \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int left = min(VEC, lim_b[h] - k0_);                                                      \
        cp_async16(&Bs[s_ * B_TILE + dst_b[h]], left > 0 ? src_b[h] + k0_ : B,                          \
                   max(left, 0) * (int)sizeof(STORE_T));                                                \
    }
#endif
    const int nk = (K + BK - 1) / BK;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) ISSUE(s);
        CP_COMMIT();
    }
    for (int kt = 0; kt < nk; ++kt) {
        CP_WAIT();                       // tile kt has landed (at most STAGES - 2 younger groups in flight)
        barrier(CLK_LOCAL_MEM_FENCE);    // ... for every thread; and everyone is done with tile kt - 1
        if (kt + STAGES - 1 < nk) ISSUE(kt + STAGES - 1);   // into the stage tile kt - 1 used
        CP_COMMIT();
        __local const LTYPE *as = As + (kt % STAGES) * A_TILE, *bs = Bs + (kt % STAGES) * B_TILE;
#elif defined(ALIGNED)
    // register prefetch: the next k slice is in flight while the matrix units work on this one
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
    uint4 ra[CH_A], rb[CH_B];
#define FETCH(k0)                                                                                       \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            const int gm = m0 + r, gk = (k0) + kc;                                                      \
            ra[h] = gm < M ? load_vec(A, (long)gm * a_rs + gk, gk + VEC <= K, K - gk) : (uint4)(0);     \
        }                                                                                               \
        FETCH_B(k0);                                                                                    \
    } while (0)
#ifdef B_KMAJOR
#define FETCH_B(k0)                                                                                     \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        const int gk = (k0) + k, gn = n0 + nc;                                                          \
        rb[h] = gk < K ? load_vec(B, (long)gk * b_ks + gn, gn + VEC <= N, N - gn) : (uint4)(0);         \
    }
#define STORE_B()                                                                                       \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        *(__local uint4 *)&Bs[K_OFF(k, nc)] = rb[h];                                                    \
    }
#else
#define FETCH_B(k0)                                                                                     \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        const int gn = n0 + c, gk = (k0) + kc;                                                          \
        rb[h] = gn < N ? load_vec(B, (long)gn * b_ns + gk, gk + VEC <= K, K - gk) : (uint4)(0);         \
    }
#define STORE_B()                                                                                       \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        *(__local uint4 *)&Bs[R_OFF(c, kc)] = rb[h];                                                    \
    }
#endif
#define STORE_TILES()                                                                                   \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            *(__local uint4 *)&As[R_OFF(r, kc)] = ra[h];                                                \
        }                                                                                               \
        STORE_B();                                                                                      \
    } while (0)
    FETCH(0);
    STORE_TILES();
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k0 = 0; k0 < K; k0 += BK) {
        if (k0 + BK < K) FETCH(k0 + BK);
        __local const LTYPE *as = As, *bs = Bs;
#else
    for (int k0 = 0; k0 < K; k0 += BK) {
        // any strides: element loads, consecutive work-items along the operand's contiguous axis
        if (a_ks == 1) {
            for (int idx = tid; idx < BM * BK; idx += THREADS) {
                const int r = idx / BK, k = idx % BK, gm = m0 + r, gk = k0 + k;
                As[R_OFF(r, k)] = (gm < M && gk < K) ? to_lds(A, (long)gm * a_rs + gk) : (LTYPE)0;
            }
        } else {
            for (int idx = tid; idx < BM * BK; idx += THREADS) {
                const int r = idx % BM, k = idx / BM, gm = m0 + r, gk = k0 + k;
                As[R_OFF(r, k)] = (gm < M && gk < K) ? to_lds(A, (long)gm * a_rs + (long)gk * a_ks) : (LTYPE)0;
            }
        }
#ifdef B_KMAJOR
        for (int idx = tid; idx < BN * BK; idx += THREADS) {
            const int c = idx % BN, k = idx / BN, gn = n0 + c, gk = k0 + k;
            Bs[K_OFF(k, c)] = (gn < N && gk < K) ? to_lds(B, (long)gk * b_ks + (long)gn * b_ns) : (LTYPE)0;
        }
#else
        for (int idx = tid; idx < BN * BK; idx += THREADS) {
            const int c = idx / BK, k = idx % BK, gn = n0 + c, gk = k0 + k;
            Bs[R_OFF(c, k)] = (gn < N && gk < K) ? to_lds(B, (long)gk * b_ks + (long)gn * b_ns) : (LTYPE)0;
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        __local const LTYPE *as = As, *bs = Bs;
#endif
#if DBUF
        // fragments double-buffered in registers: step s + 1's are read while step s's mma issue
        uint a[2][MT][4], b[2][NT][2];
        {
            const int kk = 0;
            LOAD_A(a[0]);
            LOAD_B(b[0]);
        }
        MMA_UNROLL
        for (int s = 0; s < BK / KSTEP; ++s) {
            if (s + 1 < BK / KSTEP) {
                const int kk = (s + 1) * KSTEP;
                LOAD_A(a[(s + 1) & 1]);
                LOAD_B(b[(s + 1) & 1]);
            }
            MMA_ALL(a[s & 1], b[s & 1]);
        }
#else
        MMA_UNROLL
        for (int kk = 0; kk < BK; kk += KSTEP) {
            uint a[MT][4], b[NT][2];
            LOAD_A(a);
            LOAD_B(b);
            MMA_ALL(a, b);
        }
#endif
#if defined(ALIGNED) && !defined(ASYNC)
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + BK < K) {
            STORE_TILES();
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#elif !defined(ASYNC)
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

    MMA_STORE_ACC(wm, 16, wn);
}
