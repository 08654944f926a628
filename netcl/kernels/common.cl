/* Shared by every kernel file (#include "common.cl"): the switches of netcl.kernels.dtype_defines and
 * the activation names of netcl.kernels.ACTIVATIONS.
 *   T, ACC     storage and arithmetic C types of the kernel's dtype
 *   IS_HALF    T is half: read with vload_half, written with vstore_half_rte, computed in float
 *   USE_FP64   T is double (enables cl_khr_fp64)
 *   ACT        the fused activation: ACT_NONE, ACT_RELU, ACT_GELU (erf), ACT_GELU_TANH or ACT_SILU */
#ifndef NETCL_COMMON_CL
#define NETCL_COMMON_CL
#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_GELU 2
#define ACT_GELU_TANH 3
#define ACT_SILU 4
#ifndef ACT
#define ACT ACT_NONE
#endif
#endif
