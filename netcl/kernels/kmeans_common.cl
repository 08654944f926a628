/* Shared by the k-means kernel files (kmeans.cl, kmeans_gpu.cl, kmeans_cpu.cl).
 *
 * Data: x is a contiguous block of `n` rows of `d` features (XT: T, or half data) starting at element
 * x_off; its first row is row `row0` of the whole data set, which indexes the data-set-wide arrays
 * (labels, dist, closest, weights). Every kernel works on the centred data x - shift (shift: the data's
 * mean, d values), as scikit-learn subtracts the mean before clustering: the ||x||^2 - 2 x.c + ||c||^2
 * expansion loses far less to rounding near the origin. Centers live on the device centred too.
 * HAS_WEIGHT: per-row sample weights `w` (else every row weighs 1 and `w` is not read).
 * Arithmetic in ACC (the type of T: float or double). Centers, sums, norms, distances and weights are T.
 * Half data (X_HALF: float16, X_BF16: bfloat16 bits in a ushort; T float): x only is stored narrower, read
 * through XLOAD(p, i) (one element as ACC) and XLOADV(N, p) (N consecutive elements as an ACC vector). */
#ifndef NETCL_KMEANS_COMMON_CL
#define NETCL_KMEANS_COMMON_CL
#include "common.cl"

#ifdef IS_HALF
#error "k-means kernels compute in float32 or float64 (half data: X_HALF / X_BF16 with T float)"
#endif
#if (defined(X_HALF) || defined(X_BF16)) && defined(USE_FP64)
#error "k-means: half data computes in float32"
#endif

#define KM_CAT_(a, b) a##b
#define KM_CAT(a, b) KM_CAT_(a, b)

#if defined(X_HALF)
#define XT half
#define XLOAD(p, i) NC_LDH(p, i)
#define XLOADV(N, p) KM_CAT(vload_half, N)(0, p)
#elif defined(X_BF16)
#define XT ushort
#define XLOAD(p, i) nc_bf2f((p)[i])
#define XLOADV(N, p) KM_CAT(as_float, N)(KM_CAT(convert_uint, N)(KM_CAT(vload, N)(0, p)) << 16)
#else
#define XT T
#define XLOAD(p, i) ((ACC)(p)[i])
#define XLOADV(N, p) KM_CAT(vload, N)(0, p)
#endif

#ifdef HAS_WEIGHT
#define KM_WEIGHT(w, i) ((ACC)(w)[i])
#else
#define KM_WEIGHT(w, i) ((ACC)1)
#endif

#define KM_INF ((ACC)INFINITY)

// The end of a GEMM-shaped assignment (kmeans_gpu.cl, kmeans_mma.cl) over block rows m0 .. m0 + BM - 1, run by
// every work-item of the group (nt of them, this one tid) once each row's S partial results (its smallest value
// and that center) are in fold / fold_idx (row r's at r * S ..) and visible: the row's label (the smallest
// value, then the smallest index), its exact distance to that center (partial sums over features s, s + S, ...
// added in the order s = 0 .. S - 1), both stored, and the labels that changed counted into `changed` (one
// atomic a group) when count_changes is set. The kernel's names (x, x_off, n, d, m0, row0, shift, centers,
// labels, dist, fold, fold_idx, nchanged, changed, count_changes, tid). A macro, not a function: PoCL 3.0 counted
// every row once per work-item when these barriers sat in an inlined function
#define KM_FINISH_BLOCK(S, nt)                                                                          \
    do {                                                                                                \
        for (int r_ = tid; r_ < BM; r_ += (nt)) {                                                       \
            ACC v_ = fold[r_ * (S)];                                                                    \
            int c_ = fold_idx[r_ * (S)];                                                                \
            for (int s_ = 1; s_ < (S); ++s_) {                                                          \
                const ACC vs_ = fold[r_ * (S) + s_];                                                    \
                const int cs_ = fold_idx[r_ * (S) + s_];                                                \
                if (vs_ < v_ || (vs_ == v_ && cs_ < c_)) {                                              \
                    v_ = vs_;                                                                           \
                    c_ = cs_;                                                                           \
                }                                                                                       \
            }                                                                                           \
            fold_idx[r_ * (S)] = c_;                                                                    \
        }                                                                                               \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                   \
        for (int e_ = tid; e_ < BM * (S); e_ += (nt)) {                                                 \
            const int r_ = e_ / (S);                                                                    \
            const long row_ = min((long)(m0 + r_), (long)n - 1);                                        \
            const int c_ = fold_idx[r_ * (S)];                                                          \
            ACC s_ = 0;                                                                                 \
            for (int f_ = e_ % (S); f_ < d; f_ += (S)) {                                                \
                const ACC diff_ = (XLOAD(x, x_off + row_ * d + f_) - (ACC)shift[f_]) -                  \
                                  (ACC)centers[(long)c_ * d + f_];                                      \
                s_ += diff_ * diff_;                                                                    \
            }                                                                                           \
            fold[e_] = s_;                                                                              \
        }                                                                                               \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                   \
        int mine_ = 0;                                                                                  \
        for (int r_ = tid; r_ < BM; r_ += (nt)) {                                                       \
            const long row_ = (long)m0 + r_;                                                            \
            if (row_ >= n) continue;                                                                    \
            ACC s_ = 0;                                                                                 \
            for (int q_ = 0; q_ < (S); ++q_) s_ += fold[r_ * (S) + q_];                                 \
            const int c_ = fold_idx[r_ * (S)];                                                          \
            if (count_changes && labels[row0 + row_] != c_) ++mine_;                                    \
            labels[row0 + row_] = c_;                                                                   \
            dist[row0 + row_] = s_;                                                                     \
        }                                                                                               \
        if (count_changes) {                                                                            \
            if (mine_) atomic_add(nchanged, mine_);                                                     \
            barrier(CLK_LOCAL_MEM_FENCE);                                                               \
            if (tid == 0 && nchanged[0]) atomic_add(changed, nchanged[0]);                              \
        }                                                                                               \
    } while (0)

#endif
