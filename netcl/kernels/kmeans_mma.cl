// k-means' assignment on NVIDIA's matrix units, for half rows (X_HALF: float16, X_BF16: bfloat16): the dot
// products x.c as gemm_mma.cl's block computes a GEMM (mma.sync m16n8k16, float32 accumulators), with the
// row arg-min folded into the C fragments instead of storing them. Data layout and shift: kmeans_common.cl.
//
// kmeans_pack_mma: the centers (k x d, row-major, centred, float) rounded to the rows' half format into ch
// (kpad x dpad 16-bit patterns, zero-padded: the GEMM's B with k contiguous, the "col" operand of mma) and
// cn[c] = ||c_h||^2 + 2 shift.c_h of the rounded center c_h (+inf for the padding, which so never wins). The
// rows reach the matrix units as stored (cp.async cannot subtract the shift), and
// ||x - shift - c_h||^2 = ||x - shift||^2 - 2 x.c_h + cn[c], so argmin_c (cn[c] - 2 x.c_h) is the nearest.
//
// kmeans_assign_mma: label[i] = the nearest center (the first on ties), dist[i] = the exact float32
// ||x_i - shift - c_label||^2 (the float32 centers, not the rounded ones). No n x k buffer. A work-group
// owns BM rows and walks every center tile of BN centers, each NKT k tiles of BK features, as one stream of
// tiles through the GEMM's loaders and ring (gemm_mma_loop.cl: TILE_K0 / TILE_B_OFF pick the tile, so the
// next center tile's first slice is in flight during the last products of the one before). After a
// center tile's last k tile every lane folds its C fragments (c0 c1: row g, columns 2t, 2t+1; c2 c3: row
// g+8; per 16-row tile i and 8-column tile j of its warp patch), in increasing center order, into a running
// (min, index) for each of its 2 * MT rows, and zeroes them. The fold across the 4 lanes of a row and the
// WARPS_N warps of a block row goes through local memory (the tiles' space, after the loop), ties broken
// by index; then the exact distance of the winner is summed by the S = 4 * WARPS_N work-items of the row
// (features s, s + S, ...), and the labels that changed are counted (one atomic per work-group) when
// count_changes is set. Rows past n read as zeros; their results are dropped.
// Layout: local (THREADS), global (ceil(n / BM) * THREADS). Reads x, shift, ch, cn, centers (and labels);
// writes labels, dist, changed.
// Local memory: the GEMM's tiles (RING * (A_TILE + B_TILE) 16-bit values) or the fold's BM * S values and
// indices, whichever is larger; the emulation's scratch.
//
// Knobs: gemm_mma.cl's BM, BN, BK, WM, WN, PAD, PADB, ASYNC, STAGES, LDMATRIX, MMA_EMULATE (ALIGNED is
// always on: rows and packed centers are contiguous along k; ASYNC needs x's rows on 16-byte boundaries,
// which the host checks per launch); NKT = ceil(d / BK), k tiles per center tile (set by the host).

#include "kmeans_common.cl"

#if defined(X_HALF)
#define MMA_F16
#define KM_TO_BITS(v) nc_f2h(v)
#define KM_FROM_BITS(h) nc_h2f(h)
#elif defined(X_BF16)
#define MMA_BF16
#define KM_TO_BITS(v) nc_f2bf(v)
#define KM_FROM_BITS(h) nc_bf2f(h)
#else
#error "kmeans_mma.cl: rows of half data (X_HALF or X_BF16)"
#endif
#ifndef ALIGNED
#define ALIGNED
#endif
#define MMA_IN_T ushort   // A (the rows) and B (the packed centers) as 16-bit patterns
#include "gemm_mma_tile.cl"

#if DYN_LOCAL || SWIZZLE || defined(B_KMAJOR) || defined(MMA_TF32)
#error "kmeans_mma.cl: static padded tiles, B with k contiguous, 16-bit inputs"
#endif
#ifndef NKT
#define NKT 1
#endif

__kernel void kmeans_pack_mma(__global const T *centers, const int k, const int d, const int kpad, const int dpad,
                              __global const T *shift, __global ushort *ch, __global T *cn)
{
    const int c = get_global_id(0);
    if (c >= kpad) return;
    ACC norm = 0, cross = 0;
    for (int f = 0; f < dpad; ++f) {
        const ushort h = KM_TO_BITS((c < k && f < d) ? (ACC)centers[(long)c * d + f] : (ACC)0);
        const ACC r = KM_FROM_BITS(h);
        ch[(long)c * dpad + f] = h;
        norm += r * r;
        if (f < d) cross += (ACC)shift[f] * r;
    }
    cn[c] = c < k ? norm + (ACC)2 * cross : KM_INF;
}

#define KM_S (4 * WARPS_N)   // fold slots per row: the 4 lanes of a row in each warp of a block row
#define KM_TILE_BYTES (RING * (A_TILE + B_TILE) * 2)
#define KM_FOLD_BYTES (BM * KM_S * 8)
#define KM_LOCAL_U4 (((KM_TILE_BYTES > KM_FOLD_BYTES ? KM_TILE_BYTES : KM_FOLD_BYTES) + 15) / 16)

// after the last k tile of a center tile: fold the lane's C fragments into its rows' running minima, zero them
#define KM_FOLD_FRAGMENTS(kt)                                                                       \
    if ((kt) % NKT == NKT - 1) {                                                                    \
        const int nb_ = TILE_N0(kt) + wn + 2 * t;                                                   \
        _Pragma("unroll") for (int j = 0; j < NT; ++j) {                                            \
            _Pragma("unroll") for (int p = 0; p < 2; ++p) {                                         \
                const int c = nb_ + j * 8 + p;                                                      \
                const float norm = (float)cn[c];                                                    \
                _Pragma("unroll") for (int i = 0; i < MT; ++i) {                                    \
                    _Pragma("unroll") for (int h = 0; h < 2; ++h) {                                 \
                        const float v = norm - 2.0f * acc[i][j][2 * h + p];                         \
                        if (v < best[i][h]) {                                                       \
                            best[i][h] = v;                                                         \
                            best_idx[i][h] = c;                                                     \
                        }                                                                           \
                        acc[i][j][2 * h + p] = 0.0f;                                                \
                    }                                                                               \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
    }

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void kmeans_assign_mma(__global const XT *x, const long x_off, const int n, const int d, const long row0,
                       __global const T *shift, __global const ushort *ch, __global const T *cn, const int kpad,
                       const int dpad, __global const T *centers, __global int *labels, __global T *dist,
                       __global int *changed, const int count_changes)
{
    // one area: the GEMM's tiles during the loop, the fold's values and indices after it
    __local uint4 tiles_[KM_LOCAL_U4];
    __local LTYPE *As = (__local LTYPE *)tiles_;
    __local LTYPE *Bs = As + RING * A_TILE;
    __local float *fold = (__local float *)tiles_;               // BM x KM_S
    __local int *fold_idx = (__local int *)(fold + BM * KM_S);  // BM x KM_S
    __local int nchanged[1];
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS_M * WARPS_N * 16 * KSTEP];
    __local float scratch_b[WARPS_M * WARPS_N * KSTEP * 8];
#endif
    // the GEMM's names: A = the rows (M x K, k contiguous), B = the packed centers (N x K, k contiguous)
    __global const ushort *A = (__global const ushort *)x + x_off;
    __global const ushort *B = ch;
    const int M = n, N = kpad, K = d;
    const long a_rs = d, a_ks = 1, b_ks = 1, b_ns = dpad;
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = get_group_id(0) * BM, n0 = 0;
    MMA_ACC_ZERO();
    float best[MT][2];
    int best_idx[MT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        best[i][0] = best[i][1] = INFINITY;
        best_idx[i][0] = best_idx[i][1] = 0;
    }
    if (tid == 0) nchanged[0] = 0;

#define GEMM_NTILES (NKT * (kpad / BN))
#define TILE_K0(kt) (((kt) % NKT) * BK)
#define TILE_N0(kt) (((kt) / NKT) * BN)
#define TILE_B_OFF(kt) ((long)TILE_N0(kt) * b_ns)
#define TILE_DONE(kt) KM_FOLD_FRAGMENTS(kt)
#include "gemm_mma_loop.cl"

    // fold across the 4 lanes of each row and the WARPS_N warps: the smallest value, then the smallest index
    barrier(CLK_LOCAL_MEM_FENCE);
    const int slot = (warp % WARPS_N) * 4 + t;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wm + i * 16 + g + 8 * h;
            fold[r * KM_S + slot] = best[i][h];
            fold_idx[r * KM_S + slot] = best_idx[i][h];
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    KM_FINISH_BLOCK(KM_S, THREADS);
}
