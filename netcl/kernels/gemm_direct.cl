// Direct GEMM for small or skinny shapes (and any strides): C = epilogue(A @ B), see gemm_common.cl.
// Layout: global (N, M, batch), local chosen by the host (or none); one work-item computes one element
// C[z, m, n] as a dot product over K, reading A and B in place with arbitrary element strides.
// Work-items along dimension 0 share a row of A and read neighbouring columns of B, so GPUs coalesce
// row-major B and PoCL vectorises across them. Reads A, B (, bias, residual); writes C.
// Tuning knobs:
//   UNROLL  K-loop unroll factor hint (default 4)

#include "gemm_common.cl"

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

// Split-K finish: C[m, n] = epilogue(sum over s of partial[s, m, n]) for the S partial products that a
// split-K GEMM wrote to a contiguous (S, M, N) accumulator-typed workspace (used when M x N alone has too
// few tiles to fill a GPU). Layout: global (N / RED_VEC, M, 1); one work-item per RED_VEC elements of C.
// RED_VEC 4 (N a multiple of 4: the host checks): four columns a work-item, the slices read 16 bytes at a time
// (H200, 512 x 512 from 8 slices: one float a work-item read the 8.5 MB at ~1 TB/s).
// Reads the workspace (, bias, residual); writes C. Same argument tail as GEMM_ARGS after C.
#ifndef RED_VEC
#define RED_VEC 1
#endif
#if RED_VEC != 1 && RED_VEC != 4
#error "gemm_reduce_splits: RED_VEC is 1 or 4"
#endif
__kernel void gemm_reduce_splits(const int S, const int M, const int N, __global const ACC_T *partial,
                                 __global STORE_T *C, const long c_off, const long c_rs,
                                 __global const STORE_T *bias, const long bias_off, const long bias_stride,
                                 __global const STORE_T *residual, const long res_off, const long res_rs,
                                 const long res_cs, const ACC_T alpha)
{
    const int n = get_global_id(0) * RED_VEC;
    const int m = get_global_id(1);
    if (n >= N || m >= M) return;
    bias += bias_off;
    residual += res_off;
    const long plane = (long)M * N;
#if RED_VEC == 4
    __global const ACC4 *const part4 = (__global const ACC4 *)partial + ((long)m * N + n) / 4;
    // eight slices' loads in flight at a time, added in slice order (the same sums as one at a time)
    ACC4 acc = 0;
    int s = 0;
    for (; s + 8 <= S; s += 8) {
        ACC4 v[8];
        #pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = part4[(s + u) * (plane / 4)];
        #pragma unroll
        for (int u = 0; u < 8; ++u) acc += v[u];
    }
    for (; s < S; ++s) acc += part4[s * (plane / 4)];
    const long c = c_off + m * c_rs + n;
    STORE1(gemm_epilogue(acc.s0, m, n, alpha, bias, bias_stride, residual, res_rs, res_cs), c, C);
    STORE1(gemm_epilogue(acc.s1, m, n + 1, alpha, bias, bias_stride, residual, res_rs, res_cs), c + 1, C);
    STORE1(gemm_epilogue(acc.s2, m, n + 2, alpha, bias, bias_stride, residual, res_rs, res_cs), c + 2, C);
    STORE1(gemm_epilogue(acc.s3, m, n + 3, alpha, bias, bias_stride, residual, res_rs, res_cs), c + 3, C);
#else
    ACC_T acc = 0;
    for (int s = 0; s < S; ++s) acc += partial[s * plane + (long)m * N + n];
    STORE1(gemm_epilogue(acc, m, n, alpha, bias, bias_stride, residual, res_rs, res_cs), c_off + m * c_rs + n, C);
#endif
}

// Dot-product GEMM for GPUs on thin problems whose operands are both contiguous along K (x @ W.T
// with few rows of x, e.g. decoding one token): gemm_direct would read W across rows (uncoalesced).
// Layout: local (DOT_WG, 1, 1), global (N * DOT_WG, M, batch); a work-group computes one C[z, m, n]:
// its work-items stride over k (neighbours read neighbouring k of both rows), then a local-memory
// tree reduction. Reads A, B (, bias, residual); writes C.
// Tuning knobs:
//   DOT_WG  work-items per output, a power of two (default 64)

#ifndef DOT_WG
#define DOT_WG 64
#endif

__kernel __attribute__((reqd_work_group_size(DOT_WG, 1, 1)))
void gemm_dot(GEMM_ARGS)
{
    __local ACC_T part[DOT_WG];
    const int lid = get_local_id(0);
    const int n = get_group_id(0);
    const int m = get_group_id(1);
    GEMM_SELECT_BATCH(get_group_id(2));
    __global const STORE_T *a = A + m * a_rs;
    __global const STORE_T *b = B + n * b_ns;
    ACC_T acc = 0;
    if (n < N && m < M)
        for (int k = lid; k < K; k += DOT_WG)
            acc = mad((ACC_T)LOAD1(k * a_ks, a), (ACC_T)LOAD1(k * b_ks, b), acc);
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = DOT_WG / 2; s > 0; s >>= 1) {
        if (lid < s) part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && n < N && m < M) STORE1(GEMM_EPILOGUE(part[0], m, n), m * c_rs + n, C);
}
