// Shared prelude of the GEMM kernels (gemm_direct.cl, gemm_cpu.cl, gemm_tiled.cl): storage and
// accumulation types per dtype, loads/stores, and the fused epilogue. The host prepends this text to
// each GEMM kernel file before building (one program per file and define set).
//
// Every GEMM computes, for each batch z, row m and column n of C:
//   acc      = sum_k A[z, m, k] * B[z, k, n]            (accumulated in ACC_T: float, or double)
//   y        = ALPHA * acc (+ bias[n])
//   y        = activation(y)                             (none, relu, gelu, gelu_tanh, silu)
//   C[z,m,n] = y (+ residual[z, m, n])
//
// Build options shared by all GEMM kernels:
//   IS_HALF / USE_FP64 (common.cl)    storage dtype of A, B, C, bias and residual: half or double
//                                      (float32 when neither); IS_BF16 (bfloat16) for gemm_mma.cl only
//   HAS_BIAS      add bias[n] (bias is a vector over columns with element stride bias_stride)
//   BIAS_ROWS     with HAS_BIAS: add bias[m] instead (a vector over rows: a convolution's per-channel bias)
//   HAS_RESIDUAL  add residual[z, m, n] after the activation (any strides)
//   MASK_RESIDUAL (HAS_RESIDUAL off) the `residual` operand is a mask instead: C = residual > 0 ? y : 0
//                 (a ReLU's backward, where(out > 0, g @ W, 0), in the GEMM that makes g @ W)
//   ACT           ACT_NONE, ACT_RELU, ACT_GELU (erf), ACT_GELU_TANH, ACT_SILU (common.cl)
//   C_ACC         C holds ACC_T partial sums, no epilogue (split-K's workspace for inputs narrower than
//                 the accumulator; gemm_mma.cl only: the other kernels split K at float32 storage)
//   SPLIT_LAST    split-K summed in the kernel (gemm_tiled.cl, gemm_mma.cl, gemm_wgmma.cl; float32
//                 accumulators): batch z of the launch is K slice z (A and B moved by bs_ab, C and the
//                 residual not); every work-group writes its raw sums to slice z of the float workspace
//                 `work` (S = get_num_groups(2) slices of M x N), and the last of a block's S work-groups to
//                 finish (nc_last_arrival on arrivals[its block]) adds the S slices in order 0 .. S-1 from
//                 0 (its own read back too) and stores C through the epilogue: the bits of the separate
//                 reduction (gemm_reduce_splits), one launch fewer

#include "common.cl"

#if defined(USE_FP64)
typedef double STORE_T;   // element type in memory
typedef double ACC_T;     // accumulation type
typedef double2 ACC2;
typedef double4 ACC4;
typedef double8 ACC8;
typedef double16 ACC16;
#define LOAD1(i, p) ((p)[i])
#define STORE1(v, i, p) ((p)[i] = (v))
#define LOADV(W, i, p) GEMM_CAT(vload, W)(i, p)
#define STOREV(W, v, i, p) GEMM_CAT(vstore, W)(v, i, p)
#elif defined(IS_BF16)
// bfloat16 bit patterns (ushort): scalar loads and stores only, for the kernels that move the operands as bits
// (gemm_mma.cl) and read only the epilogue's values; the portable path takes bfloat16 through float32
typedef ushort STORE_T;
typedef float ACC_T;
typedef float4 ACC4;
#define LOAD1(i, p) nc_bf16_to_float((p)[i])
#define STORE1(v, i, p) ((p)[i] = nc_float_to_bf16(v))
#elif defined(IS_HALF)
typedef half STORE_T;     // half is legal as a pointer target without cl_khr_fp16
typedef float ACC_T;
typedef float2 ACC2;
typedef float4 ACC4;
typedef float8 ACC8;
typedef float16 ACC16;
#define LOAD1(i, p) LOAD_T(p, i)
#define STORE1(v, i, p) STORE_T(p, i, v)   // round to nearest even (common.cl: conversion instructions on NVIDIA)
#define LOADV(W, i, p) GEMM_CAT(vload_half, W)(i, p)
#define STOREV(W, v, i, p) GEMM_CAT(vstore_half, W)(v, i, p)
#else
typedef float STORE_T;
typedef float ACC_T;
typedef float2 ACC2;
typedef float4 ACC4;
typedef float8 ACC8;
typedef float16 ACC16;
#define LOAD1(i, p) ((p)[i])
#define STORE1(v, i, p) ((p)[i] = (v))
#define LOADV(W, i, p) GEMM_CAT(vload, W)(i, p)
#define STOREV(W, v, i, p) GEMM_CAT(vstore, W)(v, i, p)
#endif

#if defined(C_ACC)
typedef ACC_T C_T;        // element type of C
#else
typedef STORE_T C_T;
#endif

#define GEMM_CAT_(a, b) a##b
#define GEMM_CAT(a, b) GEMM_CAT_(a, b)

inline ACC_T gemm_activation(ACC_T y)
{
#if ACT == ACT_RELU
    return fmax(y, (ACC_T)0);
#elif ACT == ACT_GELU
    return (ACC_T)0.5 * y * ((ACC_T)1 + erf(y * (ACC_T)0.70710678118654752440));
#elif ACT == ACT_GELU_TANH
    const ACC_T inner = (ACC_T)0.79788456080286535588 * (y + (ACC_T)0.044715 * y * y * y);
    return (ACC_T)0.5 * y * ((ACC_T)1 + tanh(inner));
#elif ACT == ACT_SILU
    return y / ((ACC_T)1 + exp(-y));
#else
    return y;
#endif
}

// y = act(alpha * acc + bias[n] (bias[m] with BIAS_ROWS)) + residual[m, n]; `bias` and `residual` already
// point at batch z.
inline ACC_T gemm_epilogue(ACC_T acc, const int m, const int n, const ACC_T alpha,
                           __global const STORE_T *bias, const long bias_stride,
                           __global const STORE_T *residual, const long res_rs, const long res_cs)
{
    ACC_T y = alpha * acc;
#if defined(HAS_BIAS) && defined(BIAS_ROWS)
    y += (ACC_T)LOAD1(m * bias_stride, bias);
#elif defined(HAS_BIAS)
    y += (ACC_T)LOAD1(n * bias_stride, bias);
#endif
    y = gemm_activation(y);
#ifdef HAS_RESIDUAL
    y += (ACC_T)LOAD1(m * res_rs + n * res_cs, residual);
#elif defined(MASK_RESIDUAL)
    y = (ACC_T)LOAD1(m * res_rs + n * res_cs, residual) > (ACC_T)0 ? y : (ACC_T)0;
#endif
    return y;
}

#ifndef B_T
#define B_T STORE_T  // B's element type (gemm_gemv.cl's W_INT8: uchar)
#endif

#ifdef SPLIT_LAST
#if defined(USE_FP64) || defined(C_ACC)
#error "SPLIT_LAST: float32 accumulators, C in the operands' dtype"
#endif
#define GEMM_SPLIT_ARGS , __global float *work, __global int *arrivals
// at the kernel's outermost scope: whether this work-group is its block's last (local memory)
#define GEMM_SPLIT_LOCAL __local int split_last_
// slice z's raw sum at (m, n), before the arrival (common.cl's PART_STORE: plain on NVIDIA, atomics elsewhere)
#define SPLIT_PUT(v, m, n) PART_STORE(work, (long)get_group_id(2) * M * N + (long)(m) * N + (n), (v))
// slice s's raw sum at (m, n), after it
#define SPLIT_GET(s, m, n) PART_LOAD(work, (long)(s) * M * N + (long)(m) * N + (n))
// every work-item's slice written; true (uniform) for the block's last work-group to get here
#define SPLIT_ARRIVE() nc_group_last_arrival(arrivals + get_group_id(1) * get_num_groups(0) + get_group_id(0), \
                                             get_num_groups(2), &split_last_)
#else
#define GEMM_SPLIT_ARGS
#define GEMM_SPLIT_LOCAL
#endif

// The argument list every GEMM kernel takes (the host passes the same tuple to each variant).
// Strides and offsets are in elements. Batch z = z1 * nb_inner + z2 adds z1 * stride1 + z2 * stride2
// to each operand's offset; bs_ab = (A stride1, A stride2, B stride1, B stride2), bs_cr likewise for C
// and the residual. `bias` and `residual` are ignored unless HAS_BIAS / HAS_RESIDUAL are defined. SPLIT_LAST
// adds `work` and `arrivals` (above).
#define GEMM_ARGS                                                                                   \
    const int M, const int N, const int K,                                                          \
    __global const STORE_T *A, const long a_off, const long a_rs, const long a_ks,                  \
    __global const B_T *B, const long b_off, const long b_ks, const long b_ns,                      \
    __global C_T *C, const long c_off, const long c_rs,                                             \
    __global const STORE_T *bias, const long bias_off, const long bias_stride,                      \
    __global const STORE_T *residual, const long res_off, const long res_rs, const long res_cs,     \
    const ACC_T alpha, const int nb_inner, const long4 bs_ab, const long4 bs_cr GEMM_SPLIT_ARGS

// Move every operand pointer to batch `z` (call once at the top of a kernel).
#define GEMM_SELECT_BATCH(z)                                                                        \
    do {                                                                                            \
        const long z1_ = (long)(z) / nb_inner, z2_ = (long)(z) % nb_inner;                          \
        A += a_off + z1_ * bs_ab.s0 + z2_ * bs_ab.s1;                                               \
        B += b_off + z1_ * bs_ab.s2 + z2_ * bs_ab.s3;                                               \
        C += c_off + z1_ * bs_cr.s0 + z2_ * bs_cr.s1;                                               \
        residual += res_off + z1_ * bs_cr.s2 + z2_ * bs_cr.s3;                                      \
        bias += bias_off;                                                                           \
    } while (0)

#define GEMM_EPILOGUE(acc, m, n) \
    gemm_epilogue((acc), (m), (n), alpha, bias, bias_stride, residual, res_rs, res_cs)
