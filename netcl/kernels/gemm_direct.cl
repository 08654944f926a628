// Direct GEMM for small or skinny shapes (and any strides): C = epilogue(A @ B), see gemm_common.cl.
// Layout: global (N, M, batch), local chosen by the host (or none); one work-item computes one element
// C[z, m, n] as a dot product over K, reading A and B in place with arbitrary element strides.
// Work-items along dimension 0 share a row of A and read neighbouring columns of B, so GPUs coalesce
// row-major B and PoCL vectorises across them. Reads A, B (, bias, residual); writes C.
// Tuning knobs:
//   UNROLL  K-loop unroll factor hint (default 4)

#ifndef UNROLL
#define UNROLL 4
#endif

__kernel void gemm_direct(GEMM_ARGS)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    if (n >= N || m >= M) return;
    GEMM_SELECT_BATCH(get_global_id(2));
    __global const STORE_T *a = A + m * a_rs;
    __global const STORE_T *b = B + n * b_ns;
    ACC_T acc = 0;
#pragma unroll UNROLL
    for (int k = 0; k < K; ++k)
        acc = mad((ACC_T)LOAD1(k * a_ks, a), (ACC_T)LOAD1(k * b_ks, b), acc);
    STORE1(GEMM_EPILOGUE(acc, m, n), m * c_rs + n, C);
}
