// The matrix-unit GEMM's block (gemm_mma.cl's knobs and their defaults, the local tile layouts, the loaders'
// helpers and the fragment loads of mma.sync), for the kernels built on it: gemm_mma.cl and k-means'
// assignment on matrix units (kmeans_mma.cl). Their k loop is gemm_mma_loop.cl. Knobs: gemm_mma.cl's header.
// Hook (an includer may define it first): MMA_IN_T, the element type of A and B in global memory (default
// STORE_T; k-means: ushort, the 16-bit patterns of its half rows and packed centers).
#ifndef NETCL_GEMM_MMA_TILE_CL
#define NETCL_GEMM_MMA_TILE_CL
#include "gemm_common.cl"
#include "gemm_fragments.cl"

#ifndef MMA_IN_T
#define MMA_IN_T STORE_T
#endif

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
inline uint to_lds(__global const MMA_IN_T *p, long i) {
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
inline ushort to_lds(__global const MMA_IN_T *p, long i) { return ((__global const ushort *)p)[i]; }
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
inline uint4 load_vec(__global const MMA_IN_T *p, const long i, const bool whole, const int left) {
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
inline void cp_async16(__local LTYPE *dst, __global const MMA_IN_T *src, const int bytes) {
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

#endif
