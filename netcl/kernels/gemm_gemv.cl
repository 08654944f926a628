// Matrix-vector GEMM for decoding: C (M, N) = epilogue(A (M, K) @ B (K, N)) for a few rows of A (M <= GEMV_M)
// and a B that runs along K (x @ W^T with W (N, K) row-major): each element of B is read once for all M rows,
// eight at a time (one 16-byte load for half storage, two for float32, 8 bytes for int8), so the launch
// streams the weight at the memory's bandwidth. W_INT8: B holds int8 values q stored as uchar q + 128 (B_T
// uchar) with one float scale per column n (`scales`, a row of W): C = epilogue(scale[n] * sum_k A[m, k] *
// q[k, n]), dequantized in registers.
// GLU: SwiGLU's gate and up in one launch: B has 2N columns (W's rows n and n + N: the gate's, then the
// up projection's) and C[m, n] = silu(gate) * up (no bias, activation or residual).
// Layout: local (GEMV_WG, GEMV_ROWS, 1), global (GEMV_WG, ceil(N / GEMV_ROWS) * GEMV_ROWS, 1); the GEMV_WG
// work-items of local row r share column n = group * GEMV_ROWS + r, stride over K, keep M partial sums, and
// add them in local memory. The host guarantees K-contiguous A and B, and K, row strides and offsets that
// are multiples of 8 (16-byte aligned vectors). Reads A, B (, scales, bias, residual); writes C.
// Tuning knobs:
//   GEMV_WG    work-items per column, a power of two (default 64 on GPUs, 1 on CPUs)
//   GEMV_ROWS  columns per work-group (default 4 on GPUs, 8 on CPUs)
//   GEMV_M     rows of A the kernel is built for (the host sets it to M)

#ifdef W_INT8
#define B_T uchar
#endif
#include "gemm_common.cl"

#ifndef GEMV_WG
#define GEMV_WG 64
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 4
#endif

// eight consecutive elements of the activation dtype (STORE_T) from a 16-byte aligned address
inline float8 gemv_load8(__global const STORE_T *p)
{
#if defined(IS_BF16)
    const uint4 u = vload4(0, (__global const uint *)p);
    return (float8)(as_float(u.s0 << 16), as_float(u.s0 & 0xffff0000u), as_float(u.s1 << 16),
                    as_float(u.s1 & 0xffff0000u), as_float(u.s2 << 16), as_float(u.s2 & 0xffff0000u),
                    as_float(u.s3 << 16), as_float(u.s3 & 0xffff0000u));
#elif defined(IS_HALF) && defined(NC_NVIDIA)
    const uint4 u = vload4(0, (__global const uint *)p);
    return (float8)(nc_h2f((ushort)u.s0), nc_h2f((ushort)(u.s0 >> 16)), nc_h2f((ushort)u.s1),
                    nc_h2f((ushort)(u.s1 >> 16)), nc_h2f((ushort)u.s2), nc_h2f((ushort)(u.s2 >> 16)),
                    nc_h2f((ushort)u.s3), nc_h2f((ushort)(u.s3 >> 16)));
#elif defined(IS_HALF)
    return vload_half8(0, p);
#else
    return vload8(0, p);
#endif
}

#ifdef W_INT8
inline float8 gemv_load8_w(__global const uchar *p) { return convert_float8(vload8(0, p)) - 128.0f; }
#else
#define gemv_load8_w gemv_load8
#endif

#ifdef GLU
#define GEMV_PARTS 2  // rows n (gate) and n + N (up) of W: C[m, n] = silu(gate) * up
#else
#define GEMV_PARTS 1
#endif

__kernel __attribute__((reqd_work_group_size(GEMV_WG, GEMV_ROWS, 1)))
void gemm_gemv(GEMM_ARGS, __global const float *scales)
{
    __local float part[GEMV_ROWS][GEMV_PARTS * GEMV_M][GEMV_WG];
    const int lid = get_local_id(0);
    const int r = get_local_id(1);
    const int n = get_group_id(1) * GEMV_ROWS + r;
    GEMM_SELECT_BATCH(0);
    float8 acc[GEMV_PARTS * GEMV_M];
    for (int i = 0; i < GEMV_PARTS * GEMV_M; ++i) acc[i] = (float8)(0.0f);
    if (n < N) {
        for (int j = 0; j < GEMV_PARTS; ++j) {
            __global const B_T *w = B + (n + j * N) * b_ns;
            for (int k = lid * 8; k < K; k += GEMV_WG * 8) {
                const float8 wv = gemv_load8_w(w + k);
                for (int m = 0; m < GEMV_M; ++m)
                    if (m < M)
                        acc[j * GEMV_M + m] = mad(gemv_load8(A + m * a_rs + k), wv, acc[j * GEMV_M + m]);
            }
        }
    }
    for (int i = 0; i < GEMV_PARTS * GEMV_M; ++i) {
        const float8 a = acc[i];
        const float4 h = a.lo + a.hi;
        part[r][i][lid] = (h.x + h.y) + (h.z + h.w);
    }
#if GEMV_WG > 1
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GEMV_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int i = 0; i < GEMV_PARTS * GEMV_M; ++i) part[r][i][lid] += part[r][i][lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif
    if (lid == 0 && n < N) {
#ifdef W_INT8
        const float scale = scales[n];
#else
        const float scale = 1.0f;
#endif
#ifdef GLU
  #ifdef W_INT8
        const float scale_up = scales[n + N];
  #else
        const float scale_up = 1.0f;
  #endif
        for (int m = 0; m < GEMV_M; ++m)
            if (m < M) {
                const float gate = scale * part[r][m][0], up = scale_up * part[r][GEMV_M + m][0];
                STORE1(gate / (1.0f + exp(-gate)) * up, m * c_rs + n, C);
            }
#else
        for (int m = 0; m < GEMV_M; ++m)
            if (m < M) STORE1(GEMM_EPILOGUE(scale * part[r][m][0], m, n), m * c_rs + n, C);
#endif
    }
}
