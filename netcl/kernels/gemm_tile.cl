// The tiled GEMM's block (gemm_tiled.cl's knobs and their defaults, the local-memory tile layout and the
// register-staged fetch and store of one BK-deep tile of A and B), for the kernels built on it: gemm_tiled.cl
// and k-means' assignment (kmeans_gpu.cl). Their k loop is gemm_tiled_loop.cl. A kernel that includes this
// names, in scope: M, N, K, A, B and the strides A_OFFSET/B_OFFSET read (a_rs or a_ks, b_ks or b_ns), m0
// (the block's first row), tid (linear work-item id). Knobs and layout flags: gemm_tiled.cl's header.
// Hooks (a kernel may define them before including this file; the GEMM leaves them as they are):
//   GEMM_A_ROW(m)       the row of A a 4-wide fetch reads for tile row m (default m; k-means clamps rows
//                       past M to the last one, so every row tile is interior)
//   GEMM_A_MAP(v, k)    the value staged for element v of A at k (default v; k-means subtracts shift[k])
//   GEMM_A_MAP4(v, k)   the same for a 4-wide fetch along k of elements k .. k+3 (A_TRANS == 0 only)
//   GEMM_A_LOAD(i)      element i of A as ACC_T (default LOAD1(i, A); k-means reads half data through it)
//   GEMM_A_LOAD4(i)     elements i .. i+3 of A as an ACC4, i a multiple of 4 (default GLOAD4(i, A))
#ifndef NETCL_GEMM_TILE_CL
#define NETCL_GEMM_TILE_CL
#include "gemm_common.cl"

#ifndef GEMM_A_ROW
#define GEMM_A_ROW(m) (m)
#endif
#ifndef GEMM_A_MAP
#define GEMM_A_MAP(v, k) (v)
#endif
#ifndef GEMM_A_MAP4
#define GEMM_A_MAP4(v, k) (v)
#endif
#ifndef GEMM_A_LOAD
#define GEMM_A_LOAD(i) LOAD1(i, A)
#endif
#ifndef GEMM_A_LOAD4
#define GEMM_A_LOAD4(i) GLOAD4(i, A)
#endif

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

// A work-item's compute position (tx, ty) in the TX x TY grid from its linear id: plain ids, or with WX each
// group of 32 consecutive work-items (one NVIDIA warp) covers a WX x (32/WX) patch of the grid, so one warp
// reads fewer distinct local-memory vectors per k step.
#if WX == TX
#define GEMM_TILED_TX(tid) ((int)get_local_id(0))
#define GEMM_TILED_TY(tid) ((int)get_local_id(1))
#else
#define GEMM_TILED_TX(tid) ((((tid) / 32) % (TX / WX)) * WX + ((tid) % 32) % WX)
#define GEMM_TILED_TY(tid) ((((tid) / 32) / (TX / WX)) * (32 / WX) + ((tid) % 32) / WX)
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

// Interior tile at (k0, nb): every work-item loads its float4s (no bounds checks).
#define GEMM_TILED_FETCH_VEC(k0, nb)                                                                  \
    do {                                                                                            \
        _Pragma("unroll") for (int i = 0; i < LA4; ++i) {                                           \
            const int q = tid + i * NT;                                                             \
            A_VEC_COORDS(q, mm, kk);                                                                \
            if (q < BM * BK / 4) {                                                                  \
                const long a_at_ = A_OFFSET(GEMM_A_ROW((long)(m0 + mm)), (k0) + kk);               \
                const ACC4 v_ = GEMM_A_MAP4(GEMM_A_LOAD4(a_at_), (k0) + kk);                        \
                ra[4 * i] = v_.s0; ra[4 * i + 1] = v_.s1; ra[4 * i + 2] = v_.s2; ra[4 * i + 3] = v_.s3; \
            }                                                                                       \
        }                                                                                           \
        _Pragma("unroll") for (int i = 0; i < LB4; ++i) {                                           \
            const int q = tid + i * NT;                                                             \
            B_VEC_COORDS(q, nn, kk);                                                                \
            if (q < BK * BN / 4) {                                                                  \
                const ACC4 v_ = GLOAD4(B_OFFSET((long)((k0) + kk), (nb) + nn), B);                  \
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

// Fetch this work-item's share of the A tile at k0 and the B tile at (k0, nb) into registers ra, rb
// (zero outside).
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

#define GEMM_TILED_FETCH(k0, nb)                                                                      \
    do {                                                                                            \
        _Pragma("unroll") for (int i = 0; i < LA; ++i) {                                            \
            const int e = tid + i * NT;                                                             \
            A_TILE_COORDS(e, mm, kk);                                                               \
            const int m = m0 + mm, k = (k0) + kk;                                                   \
            ra[i] = (e < BM * BK && m < M && k < K)                                                 \
                        ? GEMM_A_MAP((ACC_T)GEMM_A_LOAD(A_OFFSET((long)m, k)), k) : (ACC_T)0;       \
        }                                                                                           \
        _Pragma("unroll") for (int i = 0; i < LB; ++i) {                                            \
            const int e = tid + i * NT;                                                             \
            B_TILE_COORDS(e, nn, kk);                                                               \
            const int n = (nb) + nn, k = (k0) + kk;                                                 \
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

#endif
