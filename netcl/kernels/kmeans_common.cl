/* Shared by the k-means kernel files (kmeans.cl, kmeans_gpu.cl, kmeans_cpu.cl).
 *
 * Data: x is a contiguous block of `n` rows of `d` features (T: float or double) starting at element
 * x_off; its first row is row `row0` of the whole data set, which indexes the data-set-wide arrays
 * (labels, dist, closest, weights). Every kernel works on the centred data x - shift (shift: the data's
 * mean, d values), as scikit-learn subtracts the mean before clustering: the ||x||^2 - 2 x.c + ||c||^2
 * expansion loses far less to rounding near the origin. Centers live on the device centred too.
 * HAS_WEIGHT: per-row sample weights `w` (else every row weighs 1 and `w` is not read).
 * Arithmetic in ACC (the type of T: float or double). */
#ifndef NETCL_KMEANS_COMMON_CL
#define NETCL_KMEANS_COMMON_CL
#include "common.cl"

#ifdef IS_HALF
#error "k-means kernels take float32 or float64 data"
#endif

#define KM_CAT_(a, b) a##b
#define KM_CAT(a, b) KM_CAT_(a, b)

#ifdef HAS_WEIGHT
#define KM_WEIGHT(w, i) ((ACC)(w)[i])
#else
#define KM_WEIGHT(w, i) ((ACC)1)
#endif

#define KM_INF ((ACC)INFINITY)

#endif
