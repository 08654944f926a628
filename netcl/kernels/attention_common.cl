// Shared by the attention kernels (attention_cpu.cl, attention_gpu.cl, attention_dropout.cl): which
// (query i, key j) pairs may attend, the additive or boolean mask, and the dropout keep-mask.
//
// Problem: q (B, HQ, SQ, D), k and v (B, HKV, SK, D) with HQ = GROUP * HKV (query head h reads kv head
// h / GROUP); rows are read in place through (batch, head, row) strides, the last axis contiguous.
// L = the number of valid keys (kv_len[kv_len_off + b * kv_len_stride] clamped to [0, SK] when has_kv_len, else SK).
// Query i may attend key j iff j < L, (not causal or j <= i + L - SQ), the mask allows it (MASK_BOOL:
// nonzero; MASK_ADD: the added score is not -inf). A row with no such key gets output 0, lse -inf and
// zero gradients.
// Dropout (drop_threshold > 0): the probability p_ij is kept (and scaled by drop_scale = 1 / (1 - p))
// iff (w >> 8) >= drop_threshold, w = word j % 4 of Philox(counter (counter0 + row, j / 4, 0), key
// (seed_lo, seed_hi)), row = (b * HQ + h) * SQ + i. It depends on (seed, counter0, b, h, i, j) only, so
// the backward pass regenerates the forward's mask, on any device and in any kernel variant.
//
// Build options: T, ACC, IS_HALF, IS_BF16, USE_FP64 (common.cl); HEAD_DIM (D, any value up to 256);
// MASK = MASK_NONE | MASK_BOOL | MASK_ADD (an additive mask has the dtype T).
#ifndef NETCL_ATTENTION_COMMON_CL
#define NETCL_ATTENTION_COMMON_CL

#include "common.cl"
#include "philox.cl"

#define MASK_NONE 0
#define MASK_BOOL 1
#define MASK_ADD 2
#ifndef MASK
#define MASK MASK_NONE
#endif
#if MASK == MASK_ADD
#define MASK_T T
#else
#define MASK_T uchar
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64        // D: elements per q/k/v row
#endif

// the kernels' argument groups: a (B, H, S, D) operand's buffer, offset and batch / head / row strides; the
// mask and its strides; kv_len; dropout's threshold, scale, seed and first counter
#define KV_ARGS(n) __global const T *n, const long n##_off, const long n##_sb, const long n##_sh, const long n##_ss
// the forward's output (B, HQ, SQ, HEAD_DIM) at batch / head / row strides (the query's memory order, which the
// host picks: heads of a (B, S, H, D) projection give an output whose (B, S, H * D) reshape is a view) and
// the first element of its row (b, h, i)
#define OUT_ARGS __global T *out, const long out_sb, const long out_sh, const long out_ss
#define OUT_ROW(b, h, i) (out + (long)(b) * out_sb + (long)(h) * out_sh + (long)(i) * out_ss)
// the backward's dq, dk and dv (B, H, S, HEAD_DIM) likewise, in q's, k's and v's memory order
#define GRAD_ARGS(n) __global T *n, const long n##_sb, const long n##_sh, const long n##_ss
#define GRAD_ROW(n, b, h, j) ((n) + (long)(b) * n##_sb + (long)(h) * n##_sh + (long)(j) * n##_ss)
#define MASK_ARGS __global const MASK_T *mask, const long mask_off, const long mask_sb, const long mask_sh, \
                  const long mask_si, const long mask_sj
#define LEN_ARGS __global const int *kv_len, const long kv_len_off, const int has_kv_len, const long kv_len_stride
#define DROP_ARGS const uint drop_threshold, const ACC drop_scale, const uint seed_lo, const uint seed_hi, \
                  const ulong counter0

// one element, as ACC (common.cl: float16 by vload_half, bfloat16 as the high half of a float, else T)
#define LDS(p, i) LOAD_T(p, i)
#define STS(p, i, x) STORE_T(p, i, x)

// The number of valid keys L of batch b.
inline int valid_keys(__global const int *kv_len, const long kv_len_off, const int has_kv_len,
                      const long kv_len_stride, const int b, const int SK)
{
    if (!has_kv_len) return SK;
    return clamp(kv_len[kv_len_off + b * kv_len_stride], 0, SK);
}

// Keys [0, end) hold every key a query row <= i_last may attend (causal: bottom-right aligned).
inline int key_end(const int causal, const int i_last, const int L, const int SQ)
{
    return causal ? clamp(i_last + L - SQ + 1, 0, L) : L;
}

// A score of row i (scale * q.k already in s) after the mask: -INFINITY where i may not attend j.
inline ACC masked_score(ACC s, const int i, const int j, const int L, const int SQ, const int causal,
                        __global const MASK_T *mask, const long mask_row)
{
    if (j >= L || (causal && j > i + L - SQ)) return -INFINITY;
#if MASK == MASK_BOOL
    if (!mask[mask_row]) return -INFINITY;
#elif MASK == MASK_ADD
    s += LDS(mask, mask_row);
#endif
    return s;
}

// The four multipliers of keys 4*j4 .. 4*j4 + 3 (one Philox call).
inline void dropout_factors4(ACC *z, const ulong counter0, const long row, const int j4, const uint seed_lo,
                             const uint seed_hi, const uint drop_threshold, const ACC drop_scale)
{
    const ulong c = counter0 + (ulong)row;
    const uint4 w = philox4x32_10((uint4)((uint)c, (uint)(c >> 32), (uint)j4, 0u), (uint2)(seed_lo, seed_hi));
    z[0] = (w.x >> 8) >= drop_threshold ? drop_scale : (ACC)0;
    z[1] = (w.y >> 8) >= drop_threshold ? drop_scale : (ACC)0;
    z[2] = (w.z >> 8) >= drop_threshold ? drop_scale : (ACC)0;
    z[3] = (w.w >> 8) >= drop_threshold ? drop_scale : (ACC)0;
}

// The dropout multiplier of one (row, key) pair (the word of dropout_factors4 it falls on).
inline ACC dropout_one(const ulong counter0, const long row, const int j, const uint seed_lo, const uint seed_hi,
                       const uint drop_threshold, const ACC drop_scale)
{
    ACC z[4];
    dropout_factors4(z, counter0, row, j >> 2, seed_lo, seed_hi, drop_threshold, drop_scale);
    return z[j & 3];
}

#endif
