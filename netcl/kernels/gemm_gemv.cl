// Matrix-vector GEMM for decoding: C (M, N) = epilogue(A (M, K) @ B (K, N)) for a few rows of A (M <= GEMV_M)
// and a B that runs along K (x @ W^T with W (N, K) row-major): each element of B is read once for all M rows,
// eight at a time (one 16-byte load for half storage, two for float32, 8 bytes for int8), so the launch
// streams the weight at the memory's bandwidth. W_INT8: B holds int8 values q stored as uchar q + 128 (B_T
// uchar) with one float scale per column n (`scales`, a row of W): C = epilogue(scale[n] * sum_k A[m, k] *
// q[k, n]), dequantized in registers.
// GLU: SwiGLU's gate and up in one launch: B has 2N columns (W's rows n and n + N: the gate's, then the
// up projection's) and C[m, n] = silu(gate) * up (no bias, activation or residual).
// GEMV_RMS (with GEMV_STAGE_A; not float64): A's rows are RMS-normalized first, C = epilogue(rms_norm(A) @ B):
// after staging A, the work-group sums each row's squares over K (float32; every work-group the same sums
// in the same order, so every column sees the same normalized row) and rewrites the staged row as
// a * rsqrt(sum / K + rms_eps) * rms_w[k], rounded to A's storage like a separate rms_norm launch's output.
// One launch instead of two a norm; the normalized row is never stored (the residual is the un-normed A).
//
// Layout: local (GEMV_WG, GEMV_ROWS, 1), global (GEMV_WG, ceil(N / (GEMV_ROWS * GEMV_COLS)) * GEMV_ROWS, 1).
// The GEMV_WG work-items of local row r share the GEMV_COLS columns n0 = (group * GEMV_ROWS + r) * GEMV_COLS
// .. n0 + GEMV_COLS - 1 (and, GLU, their up rows n + N): work-item `lid` reads the 8-element chunks k = lid * 8,
// lid * 8 + GEMV_WG * 8, ... of each of those weight rows, GEMV_UNROLL chunks a row issued before the first
// is used (GEMV_UNROLL * GEMV_COLS * parts independent loads in flight), and keeps one float sum per (row,
// m) (an A chunk is converted once for all the item's weight rows). Columns past N read row N - 1 and store
// nothing, so every work-item runs the same loop (no divergence, barriers safe). The GEMV_WG sums of a
// column are added by warp shuffles (NVIDIA, GEMV_WG <= 32: one column's items are lanes of one warp, no
// barrier) or by a tree in local memory (elsewhere). GEMV_STAGE_A (the host sets it where GEMV_STAGE allows
// and A's M x K elements fit `a_stage`): the work-group copies A into local memory once, after issuing its
// first weight loads, and every column reads A there instead of through the cache.
// The host guarantees K-contiguous A and B, and K, row strides and offsets that are multiples of 8 (16-byte
// aligned vectors). Reads A, B (, scales, bias, residual, rms_w); writes C.
//
// Why the GPU defaults (GEMV_WG 32, GEMV_ROWS 8, GEMV_UNROLL 4, GEMV_COLS 1; unmeasured, sweep them with
// bench/gemv.py --sweep): by Little's law the H200 needs bandwidth x latency = ~4.1 TB/s x ~0.7 us = ~2.9 MB
// of loads in flight, ~22 KB per SM of 132; 40-64 KB a SM leaves room for the latency under load. The
// smallest decode GEMVs (K = 2048 -> N = 2048, 8 MB of bfloat16) have 2048 columns: 32 items a column is
// 65,536 items, ~500 a SM, and 4 x 16 bytes in flight each gives 32 KB a SM (the old kernel: 64 items of
// one load each, 8 KB at ~the same occupancy, matching its 28% of copy bandwidth); K = 2048 is then two
// rounds of loads a column, and N >= 11264 (GLU, lm_head) has several work-groups a SM queued (2 x 64 = 128
// bytes in flight a GLU item). One warp a column reduces with 5 shuffles and no barrier, against the old
// 6-step tree with 6 barriers over 256 items. 8 columns make work-groups of 256. GEMV_COLS 2 halves the
// reads of A for M = 8 (each A chunk then serves two weight rows) at twice the sums in registers.
//
// Tuning knobs:
//   GEMV_WG      work-items per column, a power of two (default 32 on GPUs, 1 on CPUs)
//   GEMV_ROWS    column groups per work-group (default 8 on GPUs, 8 on CPUs)
//   GEMV_COLS    columns per work-item (default 1)
//   GEMV_UNROLL  chunks of 8 elements a weight row issued before use (default 4 on GPUs, 2 on CPUs)
//   GEMV_STAGE   (host only) 1: stage A in local memory when it fits (GEMV_STAGE_A), 0: read it from global
//   GEMV_M       rows of A the kernel is built for (the host sets it to M)
//   GEMV_RMS     (host) RMSNorm A's rows in the prologue (rms_w, rms_eps); needs GEMV_STAGE_A
//   GEMV_CHAIN   (host) the program holds gemv_chain (at the end of this file: dependent GEMVs in one launch)
//                instead of gemm_gemv; CHAIN_P and CHAIN_F<i> describe its phases
//   GEMV_AHEAD_LINES, GEMV_AHEAD_PHASES, GEMV_AHEAD_FAR (host, gemv_layers: netcl.ops.gemm.chain.AHEAD) a
//                tile of a phase p in the mask GEMV_AHEAD_PHASES (bit p) waits until the phase before its own
//                (bit p of GEMV_AHEAD_FAR: the one before that) is released, then asks L2 for at most
//                GEMV_AHEAD_LINES 128-byte lines of each weight row past its first loads, then waits for its
//                own phase: a read-ahead bounded to one (two) phases

#ifdef W_INT8
#define B_T uchar
#endif
#include "gemm_common.cl"

#ifndef GEMV_WG
#define GEMV_WG 32
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 8
#endif
#ifndef GEMV_COLS
#define GEMV_COLS 1
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4
#endif
#ifndef GEMV_AHEAD_LINES
#define GEMV_AHEAD_LINES 0
#endif
#ifndef GEMV_AHEAD_FAR
#define GEMV_AHEAD_FAR 0
#endif

#ifdef GLU
#define GEMV_PARTS 2  // rows n (gate) and n + N (up) of W: C[m, n] = silu(gate) * up
#else
#define GEMV_PARTS 1
#endif
#define GEMV_NW (GEMV_PARTS * GEMV_COLS)  // weight rows a work-item reads
#define GEMV_NACC (GEMV_NW * GEMV_M)      // its sums

// Eight consecutive activations (STORE_T) from a 16-byte aligned address in address space AS: raw, then
// converted to float8 (half storage moves as the bits of a uint4: NVIDIA's vload_half8 is slow). Loads go
// through vector pointers, not vloadN: vload4 of uints need only be 4-byte aligned, and NVIDIA's compiler
// then splits it into four 4-byte loads (bench/NOTES.md, "Vector loads were not vector loads").
#if defined(IS_BF16) || (defined(IS_HALF) && defined(NC_NVIDIA))
typedef uint4 GEMV_ARAW;
#define GEMV_ALOAD(AS, p) (*(AS const uint4 *)(p))
inline float8 gemv_cvt8(const uint4 u)
{
#if defined(IS_BF16)
    return (float8)(as_float(u.s0 << 16), as_float(u.s0 & 0xffff0000u), as_float(u.s1 << 16),
                    as_float(u.s1 & 0xffff0000u), as_float(u.s2 << 16), as_float(u.s2 & 0xffff0000u),
                    as_float(u.s3 << 16), as_float(u.s3 & 0xffff0000u));
#else
    return (float8)(nc_h2f((ushort)u.s0), nc_h2f((ushort)(u.s0 >> 16)), nc_h2f((ushort)u.s1),
                    nc_h2f((ushort)(u.s1 >> 16)), nc_h2f((ushort)u.s2), nc_h2f((ushort)(u.s2 >> 16)),
                    nc_h2f((ushort)u.s3), nc_h2f((ushort)(u.s3 >> 16)));
#endif
}
#define GEMV_ACVT(u) gemv_cvt8(u)
#elif defined(IS_HALF)
typedef float8 GEMV_ARAW;
#define GEMV_ALOAD(AS, p) vload_half8(0, (AS const half *)(p))
#define GEMV_ACVT(u) (u)
#else
typedef float8 GEMV_ARAW;
#define GEMV_ALOAD(AS, p) (*(AS const float8 *)(p))  // 32-byte aligned: 8-element offsets and strides
#define GEMV_ACVT(u) (u)
#endif

// Eight consecutive weights: int8 as 8 bytes (q + 128), else like the activations
#ifdef W_INT8
typedef uint2 GEMV_WRAW;
#define GEMV_WLOAD(p) (*(__global const uint2 *)(p))
#define GEMV_WCVT(u) (convert_float8(as_uchar8(u)) - 128.0f)
#else
typedef GEMV_ARAW GEMV_WRAW;
#define GEMV_WLOAD(p) GEMV_ALOAD(__global, p)
#define GEMV_WCVT(u) GEMV_ACVT(u)
#endif

#ifdef GEMV_STAGE_A
#define GEMV_AROW(m, k) GEMV_ALOAD(__local, (__local const STORE_T *)a_stage + (m) * K + (k))
#else
#define GEMV_AROW(m, k) GEMV_ALOAD(__global, A + (m) * a_rs + (k))
#endif

#if defined(GEMV_RMS) || defined(GEMV_CHAIN)
#if (defined(GEMV_RMS) && !defined(GEMV_STAGE_A)) || defined(USE_FP64)
#error "gemm_gemv.cl: GEMV_RMS normalizes the staged rows (GEMV_STAGE_A), and GEMV_CHAIN stages its rows: float32 or half storage"
#endif
// one staged 16-byte chunk of A as floats and back (rounded to the storage like STORE1), and the norm
// weight's elements of chunk v
#if defined(IS_BF16) || defined(IS_HALF)
#define GEMV_CHUNK 8
typedef float8 gemv_chunk_f;
#if defined(IS_BF16)
#define GEMV_H2F(h) as_float((uint)(h) << 16)
#define GEMV_F2H(f) nc_float_to_bf16(f)
#else
#define GEMV_H2F(h) nc_h2f(h)
#define GEMV_F2H(f) nc_f2h(f)
#endif
inline float8 gemv_unpack(const uint4 u)
{
    return (float8)(GEMV_H2F((ushort)u.s0), GEMV_H2F((ushort)(u.s0 >> 16)), GEMV_H2F((ushort)u.s1),
                    GEMV_H2F((ushort)(u.s1 >> 16)), GEMV_H2F((ushort)u.s2), GEMV_H2F((ushort)(u.s2 >> 16)),
                    GEMV_H2F((ushort)u.s3), GEMV_H2F((ushort)(u.s3 >> 16)));
}
inline uint gemv_pack2(const float lo, const float hi)
{
    return (uint)GEMV_F2H(lo) | ((uint)GEMV_F2H(hi) << 16);
}
inline uint4 gemv_pack(const float8 f)
{
    return (uint4)(gemv_pack2(f.s0, f.s1), gemv_pack2(f.s2, f.s3), gemv_pack2(f.s4, f.s5), gemv_pack2(f.s6, f.s7));
}
inline float8 gemv_norm_weight(__global const STORE_T *w, const int v)
{
    const ushort8 h = vload8(v, (__global const ushort *)w);
    return (float8)(GEMV_H2F(h.s0), GEMV_H2F(h.s1), GEMV_H2F(h.s2), GEMV_H2F(h.s3), GEMV_H2F(h.s4),
                    GEMV_H2F(h.s5), GEMV_H2F(h.s6), GEMV_H2F(h.s7));
}
inline float gemv_sumsq(const float8 x)
{
    const float8 q = x * x;
    return ((q.s0 + q.s1) + (q.s2 + q.s3)) + ((q.s4 + q.s5) + (q.s6 + q.s7));
}
#else
#define GEMV_CHUNK 4
typedef float4 gemv_chunk_f;
#define gemv_unpack(u) as_float4(u)
#define gemv_pack(f) as_uint4(f)
#define gemv_norm_weight(w, v) vload4((v), (w))
inline float gemv_sumsq(const float4 x)
{
    const float4 q = x * x;
    return (q.x + q.y) + (q.z + q.w);
}
#endif
#endif

#if defined(NC_NVIDIA) && GEMV_WG <= 32 && !defined(GEMV_NO_SHFL)
#define GEMV_SHFL 1
// the sum of x over the GEMV_WG items of one column: lanes lid ^ s of the same warp (GEMV_WG a power of two
// <= 32 and local size x = GEMV_WG keep each column's items inside one warp)
inline float gemv_column_sum(float x)
{
    for (int s = GEMV_WG / 2; s > 0; s >>= 1) {
        uint y;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(y) : "r"(as_uint(x)), "r"(s));
        x += as_float(y);
    }
    return x;
}
#else
#define GEMV_SHFL 0
#endif
// GEMV_RMS: the column's items add their sums of squares through local memory (no shuffles, GEMV_WG > 1)
#define GEMV_RMS_TREE (GEMV_WG > 1 && !GEMV_SHFL)

#if defined(GEMV_RMS) || defined(GEMV_CHAIN)
// The RMSNorm prologue once A's rows are staged (gemm_gemv's GEMV_RMS, gemv_chain's CHAIN_RMS): ss[m] is this
// item's sum of squares over its chunks v = item, item + GEMV_WG * GEMV_ROWS, ... of row m; the sums are added
// over the work-group (a column's GEMV_WG items by warp shuffles or a tree, then the GEMV_ROWS column sums in
// order by every item: every work-group the same sums in the same order, so every column sees the same
// normalized row), and the item rewrites its own chunks of the rows m < M as x * rsqrt(sum / K + eps) * w,
// rounded to the storage like a separate rms_norm launch's output (nothing is rewritten when normalize is 0).
// rms_part: [GEMV_M][GEMV_ROWS][GEMV_RMS_TREE ? GEMV_WG : 1] floats. Every work-item calls it: its barriers,
// the last one included (the staged rows are then ready for every item), are reached by all.
#define GEMV_RMS_PART(m, j, l) rms_part[((m) * GEMV_ROWS + (j)) * (GEMV_RMS_TREE ? GEMV_WG : 1) + (l)]
inline void gemv_rms_prologue(float *ss, __local float *rms_part, __local uint4 *a_stage, const int M,
                              const int K, const int normalize, __global const STORE_T *w, const float eps)
{
    const int lid = get_local_id(0), r = get_local_id(1);
    const int per_row = K * (int)sizeof(STORE_T) / 16;
    const int item = r * GEMV_WG + lid;
#if GEMV_RMS_TREE == 0
  #if GEMV_WG > 1
    for (int m = 0; m < GEMV_M; ++m) ss[m] = gemv_column_sum(ss[m]);
  #endif
    if (lid == 0)
        for (int m = 0; m < GEMV_M; ++m) GEMV_RMS_PART(m, r, 0) = ss[m];
    barrier(CLK_LOCAL_MEM_FENCE);
#else
    for (int m = 0; m < GEMV_M; ++m) GEMV_RMS_PART(m, r, lid) = ss[m];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GEMV_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int m = 0; m < GEMV_M; ++m) GEMV_RMS_PART(m, r, lid) += GEMV_RMS_PART(m, r, lid + s);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif
    for (int m = 0; m < GEMV_M; ++m)
        if (m < M && normalize) {
            float total = 0.0f;
            for (int j = 0; j < GEMV_ROWS; ++j) total += GEMV_RMS_PART(m, j, 0);
            const float rstd = rsqrt(total / (float)K + eps);
            for (int v = item; v < per_row; v += GEMV_WG * GEMV_ROWS) {
                const gemv_chunk_f x = gemv_unpack(a_stage[m * per_row + v]);
                a_stage[m * per_row + v] = gemv_pack(x * rstd * gemv_norm_weight(w, v));
            }
        }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

#ifndef GEMV_CHAIN
__kernel __attribute__((reqd_work_group_size(GEMV_WG, GEMV_ROWS, 1)))
void gemm_gemv(GEMM_ARGS, __global const float *scales, __local uint4 *a_stage, __global const STORE_T *rms_w,
               const long rms_off, const float rms_eps)
{
    const int lid = get_local_id(0);
    const int r = get_local_id(1);
    const int n0 = (get_group_id(1) * GEMV_ROWS + r) * GEMV_COLS;
#if GEMV_WG > 1 && !GEMV_SHFL
    __local float part[GEMV_ROWS][GEMV_NACC][GEMV_WG];
#endif
    GEMM_SELECT_BATCH(0);
    rms_w += rms_off;

    // the item's weight rows: column c of part j at w[j * GEMV_COLS + c] (columns past N: row N - 1)
    __global const B_T *w[GEMV_NW];
#pragma unroll
    for (int j = 0; j < GEMV_PARTS; ++j)
#pragma unroll
        for (int c = 0; c < GEMV_COLS; ++c)
            w[j * GEMV_COLS + c] = B + (min(n0 + c, N - 1) + j * N) * b_ns;

    float acc[GEMV_NACC];
#pragma unroll
    for (int i = 0; i < GEMV_NACC; ++i) acc[i] = 0.0f;

    const int step = GEMV_WG * 8;
    int k = lid * 8;
    GEMV_WRAW wr[GEMV_NW][GEMV_UNROLL];
    // the first block of weight loads goes out before A is staged: its latency hides the copy
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
        for (int j = 0; j < GEMV_NW; ++j)
            if (k + u * step < K) wr[j][u] = GEMV_WLOAD(w[j] + k + u * step);

#ifdef GEMV_STAGE_A
    {
        // A's M rows, K elements each, into a_stage (row m at m * K) 16 bytes an item at a time
        const int per_row = K * (int)sizeof(STORE_T) / 16;
        const int item = r * GEMV_WG + lid;
#ifndef GEMV_RMS
        for (int i = item; i < M * per_row; i += GEMV_WG * GEMV_ROWS) {
            const int m = i / per_row, v = i - m * per_row;
            a_stage[m * per_row + v] = ((__global const uint4 *)(A + m * a_rs))[v];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#else
        // each item's chunks v = item, item + GEMV_WG * GEMV_ROWS, ... of every row: staged, their squares
        // summed, then (the row's rstd known) rewritten normalized by the same item. No #pragma unroll on
        // these loops over the rows: PoCL 3 (LLVM) then staged and scaled the wrong rows (M > 1)
        // the rows' partial sums after the staged rows (gemv_rms_prologue)
        __local float *rms_part = (__local float *)(a_stage + M * per_row);
        float ss[GEMV_M];
        for (int m = 0; m < GEMV_M; ++m) {
            ss[m] = 0.0f;
            if (m < M)
                for (int v = item; v < per_row; v += GEMV_WG * GEMV_ROWS) {
                    const uint4 u = ((__global const uint4 *)(A + m * a_rs))[v];
                    a_stage[m * per_row + v] = u;
                    ss[m] += gemv_sumsq(gemv_unpack(u));
                }
        }
        gemv_rms_prologue(ss, rms_part, a_stage, M, K, 1, rms_w, rms_eps);
#endif
    }
#endif

    while (k < K) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int ku = k + u * step;
            if (ku < K) {
                float8 wv[GEMV_NW];
#pragma unroll
                for (int j = 0; j < GEMV_NW; ++j) wv[j] = GEMV_WCVT(wr[j][u]);
#pragma unroll
                for (int m = 0; m < GEMV_M; ++m)
                    if (m < M) {
                        const float8 a = GEMV_ACVT(GEMV_AROW(m, ku));
#pragma unroll
                        for (int j = 0; j < GEMV_NW; ++j)
                            acc[j * GEMV_M + m] += dot(a.lo, wv[j].lo) + dot(a.hi, wv[j].hi);
                    }
            }
        }
        k += GEMV_UNROLL * step;
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < GEMV_NW; ++j)
                if (k + u * step < K) wr[j][u] = GEMV_WLOAD(w[j] + k + u * step);
    }

    // the column's GEMV_WG partial sums into acc of item lid == 0
#if GEMV_WG > 1 && GEMV_SHFL
#pragma unroll
    for (int i = 0; i < GEMV_NACC; ++i) acc[i] = gemv_column_sum(acc[i]);
#elif GEMV_WG > 1
#pragma unroll
    for (int i = 0; i < GEMV_NACC; ++i) part[r][i][lid] = acc[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GEMV_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int i = 0; i < GEMV_NACC; ++i) part[r][i][lid] += part[r][i][lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        for (int i = 0; i < GEMV_NACC; ++i) acc[i] = part[r][i][0];
#endif

    if (lid == 0) {
#pragma unroll
        for (int c = 0; c < GEMV_COLS; ++c) {
            const int n = n0 + c;
            if (n < N) {
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
                        const float gate = scale * acc[c * GEMV_M + m];
                        const float up = scale_up * acc[(GEMV_COLS + c) * GEMV_M + m];
                        STORE1(gate / (1.0f + exp(-gate)) * up, m * c_rs + n, C);
                    }
#else
                for (int m = 0; m < GEMV_M; ++m)
                    if (m < M) STORE1(GEMM_EPILOGUE(scale * acc[c * GEMV_M + m], m, n), m * c_rs + n, C);
#endif
            }
        }
    }
}
#endif  // !GEMV_CHAIN

#ifdef GEMV_CHAIN
// gemv_chain: CHAIN_P (1 to 4) GEMVs in one launch, in order: phase p may read what phases < p wrote
// (a decode layer's o-projection + residual, RMSNorm + gate/up + SwiGLU, down-projection + residual: three
// launches in one, and no gap between them). Phase i: C_i (M, N_i) = epilogue(A_i (M, K_i) @ W_i^T), W_i
// (N_i, K_i) row-major (2 N_i rows with GLU), every operand contiguous, CHAIN_F<i> its flags at build time:
// CHAIN_RMS (A_i's rows RMS-normalized in the prologue as GEMV_RMS does: weight nw_i, eps_i), CHAIN_GLU
// (C = silu(gate) * up, as GLU), CHAIN_RES (C = y + R_i, R_i (M, N_i)).
//
// Order without co-residency: each work-group takes a ticket (atomic_inc of counts[0]) when it starts and
// takes tile t of the phases' tiles in ticket order (phase 0's ceil(N_0 / GEMV_ROWS) tiles, then phase 1's,
// ...). A tile of phase p > 0 first issues its first weight loads (they depend on no phase), then waits
// until counts[p] (the tiles of phase p - 1 done) is phase p - 1's tile count, then stages its rows. It
// waits only on tiles whose tickets were taken before its own, by work-groups that are running (a ticket is
// taken by a started work-group), so no schedule deadlocks, on any number of compute units (Oclgrind and a
// one-thread CPU run the work-groups in ticket order: nothing ever waits). Each tile's stores are ordered by
// a barrier before its first item's arrival (nc_arrive: a device-scope fence, then the count), and a waiting
// tile's first item acquires in nc_wait_at_least, before the barrier its rows are staged after (on NVIDIA
// through volatile loads: L2, never an L1 line of this SM). The last tile of the last phase resets
// counts[0 .. CHAIN_P] to zero, so one buffer of the queue serves every launch and replay
// (Queue.arrival_counts). Work-group layout, loads and sums as gemm_gemv (GEMV_WG, GEMV_ROWS,
// GEMV_UNROLL; GEMV_COLS 1; GEMV_M rows at most, M of them present); a_stage holds M x max K_i elements.
#if !defined(CHAIN_P) && !defined(GEMV_LAYERS)
#error "gemm_gemv.cl: GEMV_CHAIN needs CHAIN_P, its number of phases (1 to 4)"
#endif
#define CHAIN_RMS 1
#define CHAIN_GLU 2
#define CHAIN_RES 4
#ifndef CHAIN_F0
#define CHAIN_F0 0
#endif
#ifndef CHAIN_F1
#define CHAIN_F1 0
#endif
#ifndef CHAIN_F2
#define CHAIN_F2 0
#endif
#ifndef CHAIN_F3
#define CHAIN_F3 0
#endif
#ifdef NC_NVIDIA
#define CHAIN_SRC volatile __global const
#else
#define CHAIN_SRC __global const
#endif
// CHAIN_TRACE (gemv_layers; netcl.ops.gemm.chain.TRACE): each tile stamps when it starts, when its wait
// releases it, when its rows are done and when it has arrived, with its phase and tile, into its record of
// gemv_layers' `trace` argument: slot 0 a clock, the record of ticket t at 1 + 5 t: {start, release, end,
// arrived, g | tile << 16 | compute unit << 40}. The stamps are NVIDIA's %globaltimer (ns) and %smid;
// elsewhere ticks of a device-wide counter (slot 0): an order, not a time. Written by each tile's first
// work-item; nothing in the launch reads them. Without CHAIN_TRACE `trace` is not touched.
#ifdef CHAIN_TRACE
inline ulong chain_stamp(__global ulong *trace)
{
#ifdef NC_NVIDIA
    ulong t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    return t;
#else
    return (ulong)atomic_inc((volatile __global uint *)trace) + 1;
#endif
}
inline ulong chain_unit(void)
{
#ifdef NC_NVIDIA
    uint id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
#else
    return 0;
#endif
}
#define CHAIN_STAMP(rec, i) (rec)[i] = chain_stamp(rec_clock)
#endif

// the rows' sums of squares (gemv_rms_prologue's rms_part), then the columns' partial sums
// [GEMV_ROWS][2 GEMV_M][GEMV_WG] (without shuffles): one scratch array, used one after the other
#define CHAIN_SCRATCH (GEMV_ROWS * 2 * GEMV_M * GEMV_WG)

inline void chain_tile(const int tile, const int phase, const int flags, const int wait_for, const int M,
                       const int N, const int K, CHAIN_SRC STORE_T *A, __global const STORE_T *W,
                       __global STORE_T *C, __global const STORE_T *R, __global const STORE_T *NW,
                       const float eps, __global int *counts, __local uint4 *a_stage, __local float *scratch,
                       __global ulong *rec, __global ulong *rec_clock, const int ahead_at, const int ahead)
{
    const int lid = get_local_id(0);
    const int r = get_local_id(1);
    const int n0 = tile * GEMV_ROWS + r;
    const int parts = (flags & CHAIN_GLU) ? 2 : 1;
    __global const STORE_T *w[2];
    w[0] = W + (long)min(n0, N - 1) * K;
    w[1] = W + (long)(min(n0, N - 1) + ((flags & CHAIN_GLU) ? N : 0)) * K;

    float acc[2 * GEMV_M];
#pragma unroll
    for (int i = 0; i < 2 * GEMV_M; ++i) acc[i] = 0.0f;
    const int step = GEMV_WG * 8;
    int k = lid * 8;
    GEMV_WRAW wr[2][GEMV_UNROLL];
    // the first weight loads depend on no phase: in flight while the tile waits
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            if (j < parts && k + u * step < K) wr[j][u] = GEMV_WLOAD(w[j] + k + u * step);

#if GEMV_AHEAD_LINES > 0
    // ahead >= 0: once counts[ahead_at] >= ahead (an earlier phase released), the rest of the weight rows are
    // asked of L2 (a hint: nothing waits for them; the loads below read the same bytes either way), so they
    // arrive while this tile waits, and no earlier than the host's bound; ahead < 0: no read-ahead
    if (lid == 0 && r == 0 && ahead > 0) nc_wait_at_least(counts + ahead_at, ahead);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ahead >= 0) {
        const int row_bytes = K * (int)sizeof(STORE_T);
        const int from = min(K, GEMV_UNROLL * step) * (int)sizeof(STORE_T);
        for (int i = lid; i < GEMV_AHEAD_LINES && from + i * 128 < row_bytes; i += GEMV_WG)
            for (int j = 0; j < parts; ++j) nc_prefetch_l2((__global const uchar *)w[j] + from + i * 128);
    }
#endif
    // (every barrier of this function is reached by every work-item of every tile: PoCL's work-group
    // functions computed wrong rows with barriers under a condition, even a uniform one)
    if (lid == 0 && r == 0 && wait_for > 0)
        nc_wait_at_least(counts + phase, wait_for);   // (and acquires, for every item after the barrier)
    barrier(CLK_GLOBAL_MEM_FENCE);
    mem_fence(CLK_GLOBAL_MEM_FENCE);
#ifdef CHAIN_TRACE
    if (lid == 0 && r == 0) CHAIN_STAMP(rec, 1);
#endif

    // A's rows into a_stage (row m at m * K), their squares summed for the RMSNorm prologue
    const int per_row = K * (int)sizeof(STORE_T) / 16;
    const int item = r * GEMV_WG + lid;
    float ss[GEMV_M];
    for (int m = 0; m < GEMV_M; ++m) {
        ss[m] = 0.0f;
        if (m < M)
            for (int v = item; v < per_row; v += GEMV_WG * GEMV_ROWS) {
                const uint4 u = ((CHAIN_SRC uint4 *)(A + (long)m * K))[v];
                a_stage[m * per_row + v] = u;
                if (flags & CHAIN_RMS) ss[m] += gemv_sumsq(gemv_unpack(u));
            }
    }
    gemv_rms_prologue(ss, scratch, a_stage, M, K, flags & CHAIN_RMS, NW, eps);

    while (k < K) {
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int ku = k + u * step;
            if (ku < K) {
                const float8 w0 = GEMV_WCVT(wr[0][u]);
                const float8 w1 = parts == 2 ? GEMV_WCVT(wr[1][u]) : (float8)(0.0f);
                for (int m = 0; m < GEMV_M; ++m)
                    if (m < M) {
                        const float8 a = GEMV_ACVT(GEMV_ALOAD(__local, (__local const STORE_T *)a_stage + m * K + ku));
                        acc[m] += dot(a.lo, w0.lo) + dot(a.hi, w0.hi);
                        if (parts == 2) acc[GEMV_M + m] += dot(a.lo, w1.lo) + dot(a.hi, w1.hi);
                    }
            }
        }
        k += GEMV_UNROLL * step;
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < 2; ++j)
                if (j < parts && k + u * step < K) wr[j][u] = GEMV_WLOAD(w[j] + k + u * step);
    }

    // the column's GEMV_WG partial sums into acc of item lid == 0
#if GEMV_WG > 1 && GEMV_SHFL
#pragma unroll
    for (int i = 0; i < 2 * GEMV_M; ++i) acc[i] = gemv_column_sum(acc[i]);
#elif GEMV_WG > 1
    __local float *part = scratch + r * 2 * GEMV_M * GEMV_WG;
    for (int i = 0; i < 2 * GEMV_M; ++i) part[i * GEMV_WG + lid] = acc[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GEMV_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int i = 0; i < 2 * GEMV_M; ++i) part[i * GEMV_WG + lid] += part[i * GEMV_WG + lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        for (int i = 0; i < 2 * GEMV_M; ++i) acc[i] = part[i * GEMV_WG];
#endif

    if (lid == 0 && n0 < N)
        for (int m = 0; m < GEMV_M; ++m)
            if (m < M) {
                float y = acc[m];
                if (flags & CHAIN_GLU) y = y / (1.0f + exp(-y)) * acc[GEMV_M + m];
                if (flags & CHAIN_RES) y += LOAD1((long)m * N + n0, R);
                STORE1(y, (long)m * N + n0, C);
            }
    mem_fence(CLK_GLOBAL_MEM_FENCE);  // this item's stores are visible to the work-group's first ...
    barrier(CLK_GLOBAL_MEM_FENCE);    // ... which fences at device scope before the tile counts itself done
}

// a decode attention's tiles in the launch (CHAIN_ATTN, GEMV_LAYERS): attention_gpu.cl's decode_tile (one
// #include for both: the kernel sources are expanded with each file once)
#if defined(CHAIN_ATTN) || defined(GEMV_LAYERS)
#include "attention_gpu.cl"
#endif

#ifndef GEMV_LAYERS
#define CHAIN_PHASE_ARGS(i)                                                                              \
    __global const STORE_T *a##i, const long a##i##_off, __global const STORE_T *w##i, const long w##i##_off, \
    __global STORE_T *c##i, const long c##i##_off, __global const STORE_T *r##i, const long r##i##_off,  \
    __global const STORE_T *nw##i, const long nw##i##_off, const int n##i, const int k##i, const float eps##i
#define CHAIN_TILES(i) ((n##i + GEMV_ROWS - 1) / GEMV_ROWS)
#define CHAIN_SELECT(i, wait)                                                                            \
    do {                                                                                                 \
        phase = i, tiles = CHAIN_TILES(i), wait_for = wait, flags = CHAIN_F##i, N = n##i, K = k##i, eps = eps##i; \
        A = a##i + a##i##_off, W = w##i + w##i##_off, C = c##i + c##i##_off, R = r##i + r##i##_off;         \
        NW = nw##i + nw##i##_off;                                                                        \
    } while (0)

// With CHAIN_ATTN (netcl.ops.attention's decode phase): the launch's first tiles, before phase 0's, are a
// decode step's attention (attention_gpu.cl's decode_tile with its ROPE_CACHE and PASS_DECODE defines: one tile
// a (split of the keys, kv head, batch row), tile t = (b * attn_heads + hk) * nsplit + split), and phase 0 waits
// for all of them (its input rows are the attention's output). The attention's arrival counts (its splits'
// merge) follow the chain's in `counts`, from counts + CHAIN_COUNTS (the host's define: the ticket, the
// attention's done count, the phases'); its local memory (decode_local) is a_stage, which the host sizes for
// the larger of the two. DNT <= GEMV_WG * GEMV_ROWS; the items past DNT take no slot (tid 2^28) and only
// reach the attention's barriers. The chain's count index of GEMV phase i is then i + 1.
#ifdef CHAIN_ATTN
#define CHAIN_A 1
#define CHAIN_ATTN_ARGS , KV_ARGS(q), DECODE_KV_ARGS(k), DECODE_KV_ARGS(v), MASK_ARGS, DECODE_LEN_ARGS, \
    DECODE_TAIL_ARGS, const int attn_heads, const int attn_batch
#ifndef CHAIN_COUNTS
#error "gemm_gemv.cl: CHAIN_ATTN needs CHAIN_COUNTS, where the attention's arrival counts start"
#endif
#else
#define CHAIN_A 0
#define CHAIN_ATTN_ARGS
#endif

// global (GEMV_WG, GEMV_ROWS * the phases' tiles (and the attention's), 1); the arguments of phases >= CHAIN_P
// are not read
__kernel __attribute__((reqd_work_group_size(GEMV_WG, GEMV_ROWS, 1)))
void gemv_chain(const int M, __global int *counts, __local uint4 *a_stage, CHAIN_PHASE_ARGS(0),
                CHAIN_PHASE_ARGS(1), CHAIN_PHASE_ARGS(2), CHAIN_PHASE_ARGS(3) CHAIN_ATTN_ARGS)
{
    __local float scratch[CHAIN_SCRATCH];
    __local int ticket;
    const int first = get_local_id(0) == 0 && get_local_id(1) == 0;
    if (first) ticket = atomic_inc(counts);
    barrier(CLK_LOCAL_MEM_FENCE);
    int t = ticket;
    // the tile's phase and operands (uniform over the work-group; one call below, so no barrier is under a
    // condition)
    int phase, tiles, wait_for, flags, N, K;
    float eps;
    CHAIN_SRC STORE_T *A;
    __global const STORE_T *W, *R, *NW;
    __global STORE_T *C;
#ifdef CHAIN_ATTN
    __local decode_local *lm = (__local decode_local *)a_stage;  // the host sized a_stage for either
    const int attn_tiles = nsplit * attn_heads * attn_batch;
    if (t < attn_tiles) {   // an attention tile: its phase is 0, its done count counts[1]
        const int tid = get_local_id(1) * GEMV_WG + get_local_id(0);
        const int split = t % nsplit, hk = (t / nsplit) % attn_heads, b = t / (nsplit * attn_heads);
        DECODE_PASS(tid < DNT ? tid : (1 << 28), split, hk, b, attn_heads, counts + CHAIN_COUNTS, lm);
        mem_fence(CLK_GLOBAL_MEM_FENCE);  // this item's stores are visible to the work-group's first ...
        barrier(CLK_GLOBAL_MEM_FENCE);    // ... which fences at device scope before the tile counts itself done
        if (first) nc_arrive(counts + 1);   // (releases every item's stores, ordered before by the barrier)
        return;
    }
    t -= attn_tiles;
#define CHAIN_WAIT0 attn_tiles
#else
#define CHAIN_WAIT0 0
#endif
    if (t < CHAIN_TILES(0) || CHAIN_P == 1) {
        CHAIN_SELECT(0, CHAIN_WAIT0);
    } else if ((t -= CHAIN_TILES(0)) < CHAIN_TILES(1) || CHAIN_P == 2) {
        CHAIN_SELECT(1, CHAIN_TILES(0));
    } else if ((t -= CHAIN_TILES(1)) < CHAIN_TILES(2) || CHAIN_P == 3) {
        CHAIN_SELECT(2, CHAIN_TILES(1));
    } else {
        t -= CHAIN_TILES(2);
        CHAIN_SELECT(3, CHAIN_TILES(2));
    }
    phase += CHAIN_A;
    chain_tile(t, phase, flags, wait_for, M, N, K, A, W, C, R, NW, eps, counts, a_stage, scratch, 0, 0, 0, -1);
    if (first) {
        const int done = nc_arrive(counts + 1 + phase);   // (every item's stores: chain_tile's barrier)
        if (phase == CHAIN_A + CHAIN_P - 1 && done == tiles - 1) {  // the launch's last tile: the counts for
            NC_FENCE_DEVICE();                        // the next
            for (int i = 0; i <= CHAIN_A + CHAIN_P; ++i) atomic_xchg(counts + i, 0);
        }
    }
}
#endif  // !GEMV_LAYERS
#ifdef GEMV_LAYERS
// gemv_layers: GEMV_LAYERS (1 to 32) decode layers of a Llama-style transformer for M rows at one position
// (netcl.ops.gemm.chain.gemv_layers: a decode step at batch 1) in one launch. Layer j is five phases, number
// g = 5 j + p in the launch:
//   p 0  qkv_j = rms_norm(x_j; nwa_j, eps_a) @ wq_j^T        (NQ columns: the stacked q/k/v, K = D)
//   p 1  o_j = the decode attention of qkv_j's heads with the caches kc_j, vc_j (attention_gpu.cl's decode_tile:
//        q and the new k rotated, the new k and v rows written into the caches, the keys in nsplit splits
//        merged by the last to finish; nsplit * attn_heads * attn_batch tiles)            (M x KO, KO = HQ * D_h)
//   p 2  y_j = o_j @ wo_j^T + x_j                            (D columns, K = KO)
//   p 3  h_j = silu(n @ wgu_j[:F]^T) * (n @ wgu_j[F:]^T), n = rms_norm(y_j; nwm_j, eps_m)   (F columns, K = D)
//   p 4  z_j = h_j @ wd_j^T + y_j, which is x_{j+1}          (D columns, K = F)
// x_0 is the rows `x` (x_off); layer j's qkv, o, y, h, z lie in that order in `act` from act_off + j * LAYER_ACT
// (LAYER_ACT = M (NQ + KO + D + F + D) elements), so every address of `act` is written once a launch and read
// after (no L1 line of this SM can hold it stale); the attention's lse and parts at its own strides per layer
// in lse, part_o and part_ml; its merge's arrival counts at counts + CHAIN_COUNTS + j * attn_batch * attn_heads.
// Order as gemv_chain's: tiles in ticket order, a phase's tiles wait until the phase before it is done
// (counts[g] = the tiles of phase g - 1 done; counts[0] the ticket), the attention's too; the last tile of the
// last phase resets counts[0 .. 5 GEMV_LAYERS]. Each phase computes what its own launch would (the same tile,
// loads, sums and rounding: chain_tile and decode_tile). Layer j's weights, norms and caches are arguments of
// their own (LAYER_ARGS: 8 buffers and their offsets, 128 bytes of the driver's parameter space a layer;
// the host puts as many layers in a launch as the device's CL_DEVICE_MAX_PARAMETER_SIZE holds).
#ifndef CHAIN_COUNTS
#error "gemm_gemv.cl: GEMV_LAYERS needs CHAIN_COUNTS, where the attention's arrival counts start"
#endif
#if GEMV_LAYERS < 1 || GEMV_LAYERS > 32
#error "gemm_gemv.cl: GEMV_LAYERS must be 1 to 32"
#endif
#define LAYER_ARGS(j) , __global const STORE_T *wq##j, const long wq##j##_off, __global const STORE_T *nwa##j,  \
    const long nwa##j##_off, __global T *kc##j, const long kc##j##_off, __global T *vc##j, const long vc##j##_off, \
    __global const STORE_T *wo##j, const long wo##j##_off, __global const STORE_T *nwm##j, const long nwm##j##_off, \
    __global const STORE_T *wgu##j, const long wgu##j##_off, __global const STORE_T *wd##j, const long wd##j##_off
#define LAYER_CASE(j)                                                                                      \
    case j:                                                                                                \
        wq = wq##j + wq##j##_off, nwa = nwa##j + nwa##j##_off, kc = kc##j, kc_off = kc##j##_off, vc = vc##j;    \
        vc_off = vc##j##_off, wo = wo##j + wo##j##_off, nwm = nwm##j + nwm##j##_off;                            \
        wgu = wgu##j + wgu##j##_off, wd = wd##j + wd##j##_off;                                              \
        break;
#define LAYERS_ARGS_1 LAYER_ARGS(0)
#define LAYERS_ARGS_2 LAYERS_ARGS_1 LAYER_ARGS(1)
#define LAYERS_ARGS_3 LAYERS_ARGS_2 LAYER_ARGS(2)
#define LAYERS_ARGS_4 LAYERS_ARGS_3 LAYER_ARGS(3)
#define LAYERS_ARGS_5 LAYERS_ARGS_4 LAYER_ARGS(4)
#define LAYERS_ARGS_6 LAYERS_ARGS_5 LAYER_ARGS(5)
#define LAYERS_ARGS_7 LAYERS_ARGS_6 LAYER_ARGS(6)
#define LAYERS_ARGS_8 LAYERS_ARGS_7 LAYER_ARGS(7)
#define LAYERS_ARGS_9 LAYERS_ARGS_8 LAYER_ARGS(8)
#define LAYERS_ARGS_10 LAYERS_ARGS_9 LAYER_ARGS(9)
#define LAYERS_ARGS_11 LAYERS_ARGS_10 LAYER_ARGS(10)
#define LAYERS_ARGS_12 LAYERS_ARGS_11 LAYER_ARGS(11)
#define LAYERS_ARGS_13 LAYERS_ARGS_12 LAYER_ARGS(12)
#define LAYERS_ARGS_14 LAYERS_ARGS_13 LAYER_ARGS(13)
#define LAYERS_ARGS_15 LAYERS_ARGS_14 LAYER_ARGS(14)
#define LAYERS_ARGS_16 LAYERS_ARGS_15 LAYER_ARGS(15)
#define LAYERS_ARGS_17 LAYERS_ARGS_16 LAYER_ARGS(16)
#define LAYERS_ARGS_18 LAYERS_ARGS_17 LAYER_ARGS(17)
#define LAYERS_ARGS_19 LAYERS_ARGS_18 LAYER_ARGS(18)
#define LAYERS_ARGS_20 LAYERS_ARGS_19 LAYER_ARGS(19)
#define LAYERS_ARGS_21 LAYERS_ARGS_20 LAYER_ARGS(20)
#define LAYERS_ARGS_22 LAYERS_ARGS_21 LAYER_ARGS(21)
#define LAYERS_ARGS_23 LAYERS_ARGS_22 LAYER_ARGS(22)
#define LAYERS_ARGS_24 LAYERS_ARGS_23 LAYER_ARGS(23)
#define LAYERS_ARGS_25 LAYERS_ARGS_24 LAYER_ARGS(24)
#define LAYERS_ARGS_26 LAYERS_ARGS_25 LAYER_ARGS(25)
#define LAYERS_ARGS_27 LAYERS_ARGS_26 LAYER_ARGS(26)
#define LAYERS_ARGS_28 LAYERS_ARGS_27 LAYER_ARGS(27)
#define LAYERS_ARGS_29 LAYERS_ARGS_28 LAYER_ARGS(28)
#define LAYERS_ARGS_30 LAYERS_ARGS_29 LAYER_ARGS(29)
#define LAYERS_ARGS_31 LAYERS_ARGS_30 LAYER_ARGS(30)
#define LAYERS_ARGS_32 LAYERS_ARGS_31 LAYER_ARGS(31)
#define LAYERS_CASES_1 LAYER_CASE(0)
#define LAYERS_CASES_2 LAYERS_CASES_1 LAYER_CASE(1)
#define LAYERS_CASES_3 LAYERS_CASES_2 LAYER_CASE(2)
#define LAYERS_CASES_4 LAYERS_CASES_3 LAYER_CASE(3)
#define LAYERS_CASES_5 LAYERS_CASES_4 LAYER_CASE(4)
#define LAYERS_CASES_6 LAYERS_CASES_5 LAYER_CASE(5)
#define LAYERS_CASES_7 LAYERS_CASES_6 LAYER_CASE(6)
#define LAYERS_CASES_8 LAYERS_CASES_7 LAYER_CASE(7)
#define LAYERS_CASES_9 LAYERS_CASES_8 LAYER_CASE(8)
#define LAYERS_CASES_10 LAYERS_CASES_9 LAYER_CASE(9)
#define LAYERS_CASES_11 LAYERS_CASES_10 LAYER_CASE(10)
#define LAYERS_CASES_12 LAYERS_CASES_11 LAYER_CASE(11)
#define LAYERS_CASES_13 LAYERS_CASES_12 LAYER_CASE(12)
#define LAYERS_CASES_14 LAYERS_CASES_13 LAYER_CASE(13)
#define LAYERS_CASES_15 LAYERS_CASES_14 LAYER_CASE(14)
#define LAYERS_CASES_16 LAYERS_CASES_15 LAYER_CASE(15)
#define LAYERS_CASES_17 LAYERS_CASES_16 LAYER_CASE(16)
#define LAYERS_CASES_18 LAYERS_CASES_17 LAYER_CASE(17)
#define LAYERS_CASES_19 LAYERS_CASES_18 LAYER_CASE(18)
#define LAYERS_CASES_20 LAYERS_CASES_19 LAYER_CASE(19)
#define LAYERS_CASES_21 LAYERS_CASES_20 LAYER_CASE(20)
#define LAYERS_CASES_22 LAYERS_CASES_21 LAYER_CASE(21)
#define LAYERS_CASES_23 LAYERS_CASES_22 LAYER_CASE(22)
#define LAYERS_CASES_24 LAYERS_CASES_23 LAYER_CASE(23)
#define LAYERS_CASES_25 LAYERS_CASES_24 LAYER_CASE(24)
#define LAYERS_CASES_26 LAYERS_CASES_25 LAYER_CASE(25)
#define LAYERS_CASES_27 LAYERS_CASES_26 LAYER_CASE(26)
#define LAYERS_CASES_28 LAYERS_CASES_27 LAYER_CASE(27)
#define LAYERS_CASES_29 LAYERS_CASES_28 LAYER_CASE(28)
#define LAYERS_CASES_30 LAYERS_CASES_29 LAYER_CASE(29)
#define LAYERS_CASES_31 LAYERS_CASES_30 LAYER_CASE(30)
#define LAYERS_CASES_32 LAYERS_CASES_31 LAYER_CASE(31)
#define LAYERS_CAT_(a, b) a##b
#define LAYERS_CAT(a, b) LAYERS_CAT_(a, b)

// global (GEMV_WG, GEMV_ROWS * GEMV_LAYERS * (a layer's tiles), 1)
__kernel __attribute__((reqd_work_group_size(GEMV_WG, GEMV_ROWS, 1)))
void gemv_layers(const int M, __global int *counts, __global ulong *trace, __local uint4 *a_stage,
                 __global const STORE_T *x, const long x_off, __global STORE_T *act, const long act_off, const int NQ, const int KO,
                 const int D, const int F, const float eps_a, const float eps_m, const long q_sb, const long q_sh,
                 const long q_ss, const long k_sb, const long k_sh, const long k_ss, const long v_sb,
                 const long v_sh, const long v_ss, MASK_ARGS, DECODE_LEN_ARGS, __global ACC *lse,
                 __global ACC *part_o, __global ACC *part_ml, const int nsplit, const int chunk, const int HQ,
                 const int GROUP, const int SQ, const int SK, const int causal, const ACC scale,
                 DROP_ARGS DECODE_ROPE_ARGS, const int attn_heads, const int attn_batch
                 LAYERS_CAT(LAYERS_ARGS_, GEMV_LAYERS))
{
    __local float scratch[CHAIN_SCRATCH];
    __local int ticket;
    const int first = get_local_id(0) == 0 && get_local_id(1) == 0;
    if (first) ticket = atomic_inc(counts);
    barrier(CLK_LOCAL_MEM_FENCE);
    const int T0 = (NQ + GEMV_ROWS - 1) / GEMV_ROWS, TA = nsplit * attn_heads * attn_batch;
    const int T2 = (D + GEMV_ROWS - 1) / GEMV_ROWS, T3 = (F + GEMV_ROWS - 1) / GEMV_ROWS, T4 = T2;
    const int per_layer = T0 + TA + T2 + T3 + T4;
    int t = ticket;
    __global ulong *rec_clock = trace, *rec = trace + 1 + 5 * (long)ticket;
#ifdef CHAIN_TRACE
    if (first) CHAIN_STAMP(rec, 0);
#endif
    const int j = t / per_layer;
    t -= j * per_layer;
    __global const STORE_T *wq, *nwa, *wo, *nwm, *wgu, *wd;
    __global T *kc, *vc;
    long kc_off, vc_off;
    switch (j) {
        LAYERS_CAT(LAYERS_CASES_, GEMV_LAYERS)
    }
    const long layer_act = (long)M * (NQ + KO + D + F + D);
    __global STORE_T *qkv = act + act_off + j * layer_act;
    __global STORE_T *o = qkv + (long)M * NQ, *y = o + (long)M * KO, *h = y + (long)M * D, *z = h + (long)M * F;
    __global const STORE_T *xin = j == 0 ? x + x_off : z - layer_act;   // x_j: the layer before's z

    // the tile's phase and operands (uniform over the work-group; one call of each tile function below, so
    // no barrier is under a condition PoCL mis-compiles)
    int p, tiles, wait_for;
    if (t < T0) {
        p = 0, tiles = T0, wait_for = j == 0 ? 0 : T4;
    } else if ((t -= T0) < TA) {
        p = 1, tiles = TA, wait_for = T0;
    } else if ((t -= TA) < T2) {
        p = 2, tiles = T2, wait_for = TA;
    } else if ((t -= T2) < T3) {
        p = 3, tiles = T3, wait_for = T2;
    } else {
        t -= T3;
        p = 4, tiles = T4, wait_for = T3;
    }
    const int g = 5 * j + p;
#ifdef CHAIN_TRACE
    if (first) rec[4] = (ulong)g | ((ulong)t << 16) | (chain_unit() << 40);
#endif
    if (p == 1) {   // the attention: decode_begin (its cached keys), the wait for the q/k/v product, the rest
        const int tid = get_local_id(1) * GEMV_WG + get_local_id(0), item = tid < DNT ? tid : (1 << 28);
        const int split = t % nsplit, hk = (t / nsplit) % attn_heads, b = t / (nsplit * attn_heads);
        __local decode_local *lm = (__local decode_local *)a_stage;
        const decode_span sp = decode_begin(item, split, hk, b, lm, kc, kc_off, k_sb, k_sh, k_ss, vc, vc_off, v_sb,
                                            v_sh, v_ss, DECODE_LEN_PASS, chunk, SQ, SK, causal DECODE_ROPE_PASS);
        if (first)
            nc_wait_at_least(counts + g, wait_for);
        barrier(CLK_GLOBAL_MEM_FENCE);
        mem_fence(CLK_GLOBAL_MEM_FENCE);
#ifdef CHAIN_TRACE
        if (first) CHAIN_STAMP(rec, 1);
#endif
        const long rows = (long)attn_batch * HQ * SQ;
        decode_tile(item, split, hk, b, attn_heads, counts + CHAIN_COUNTS + j * attn_batch * attn_heads, lm, sp,
                    (__global const T *)act, act_off + j * layer_act, q_sb, q_sh, q_ss, kc, kc_off, k_sb, k_sh,
                    k_ss, vc, vc_off, v_sb, v_sh, v_ss, mask, mask_off, mask_sb, mask_sh, mask_si, mask_sj,
                    (__global T *)o, lse + j * rows, part_o + j * rows * nsplit * 4 * DQ4,
                    part_ml + j * rows * nsplit * 2, nsplit, chunk, HQ, GROUP, SQ, SK, causal, scale,
                    drop_threshold, drop_scale, seed_lo, seed_hi, counter0 DECODE_ROPE_PASS);
        mem_fence(CLK_GLOBAL_MEM_FENCE);  // this item's stores are visible to the work-group's first ...
        barrier(CLK_GLOBAL_MEM_FENCE);    // ... which fences at device scope before the tile counts itself done
        if (first) {
#ifdef CHAIN_TRACE
            CHAIN_STAMP(rec, 2);
#endif
            nc_arrive(counts + 1 + g);
#ifdef CHAIN_TRACE
            CHAIN_STAMP(rec, 3);
#endif
        }
        return;
    }
    int flags, N, K;
    float eps = 0.0f;
    __global const STORE_T *A, *W, *R = xin, *NW = wq;
    __global STORE_T *C;
    if (p == 0) {
        flags = CHAIN_RMS, A = xin, W = wq, C = qkv, NW = nwa, N = NQ, K = D, eps = eps_a;
    } else if (p == 2) {
        flags = CHAIN_RES, A = o, W = wo, C = y, R = xin, N = D, K = KO;
    } else if (p == 3) {
        flags = CHAIN_RMS | CHAIN_GLU, A = y, W = wgu, C = h, NW = nwm, N = F, K = D, eps = eps_m;
    } else {
        flags = CHAIN_RES, A = h, W = wd, C = z, R = y, N = D, K = F;
    }
#if GEMV_AHEAD_LINES > 0
    // the read-ahead waits until phase g - dist is released: counts[g - dist] holds the tiles done of the
    // phase before it, `before` (none before the launch's first phases: at once)
    const int dist = (GEMV_AHEAD_FAR >> p) & 1 ? 2 : 1, before = g - dist - 1, bp = before % 5;
    const int before_tiles = bp == 0 ? T0 : bp == 1 ? TA : bp == 2 ? T2 : bp == 3 ? T3 : T4;
    const int ahead = !((GEMV_AHEAD_PHASES >> p) & 1) ? -1 : before < 0 ? 0 : before_tiles;
    const int ahead_at = g - dist;
#else
    const int ahead = -1, ahead_at = 0;
#endif
    chain_tile(t, g, flags, wait_for, M, N, K, A, W, C, R, NW, eps, counts, a_stage, scratch, rec, rec_clock,
               ahead_at, ahead);
    if (first) {
#ifdef CHAIN_TRACE
        CHAIN_STAMP(rec, 2);
#endif
        const int done = nc_arrive(counts + 1 + g);
#ifdef CHAIN_TRACE
        CHAIN_STAMP(rec, 3);
#endif
        if (g == 5 * GEMV_LAYERS - 1 && done == tiles - 1) {  // the launch's last tile: the counts for the next
            NC_FENCE_DEVICE();
            for (int i = 0; i <= 5 * GEMV_LAYERS; ++i) atomic_xchg(counts + i, 0);
        }
    }
}
#endif  // GEMV_LAYERS
#endif  // GEMV_CHAIN
