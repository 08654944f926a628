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

#endif
