// Rotary position embedding (RoPE): each pair (x1, x2) of a head vector is rotated by the angle
// p * inv_freq[i] of its position p and pair index i:
//   out1 = x1 cos - d x2 sin,   out2 = x2 cos + d x1 sin      (direction d = -1: the inverse rotation,
//   which is also the backward of the rotation).
// (rope_common.cl: rope_first and rope_second, the arithmetic every rotating kernel shares.)
// Pairing (PAIRING): ROPE_HALF pairs x[i] with x[i + D/2] (GPT-NeoX, Hugging Face Llama's
// rotate_half); ROPE_INTERLEAVED pairs x[2i] with x[2i + 1] (Meta's original Llama, GPT-J).
// x is (B, H, S, D) read through any strides; the position of row s of batch b is
// p = s + offsets[offset_off + b * offset_stride] (offset_stride 0: one offset for the batch), read on
// the device so a recorded decode step replays at the next position. cos/sin are tables (max_len, D/2) of ACC.
// OUT_AT_POSITION: out's position index is p instead of s (writes straight into a KV cache of
// max_len rows along axis 2). A position outside [0, max_len) is reported in the queue's check
// record (checks.cl) and its pair is not written.
// Layout: 2-D global (D/2, B*H*S); one work-item rotates one pair of one row (bound-checked).
// Build options: T, ACC, IS_HALF, IS_BF16, USE_FP64 (common.cl; read and written with LOAD_T/STORE_T), -DPAIRING=ROPE_HALF|ROPE_INTERLEAVED,
//   -DOUT_AT_POSITION (flag).

#include "common.cl"
#include "checks.cl"
#include "rope_common.cl"

__kernel void rope_rotate(__global const T *x, const long x_off, const long4 x_strides,
                          __global T *out, const long out_off, const long4 out_strides,
                          __global const ACC *cos_table, __global const ACC *sin_table,
                          __global const int *offsets, const long offset_off, const int offset_stride,
                          const int heads, const int seq, const long rows, const int half_dim,
                          const int max_len, const ACC direction, __global int *err, const int err_code)
{
    const int i = get_global_id(0);
    const long row = get_global_id(1);
    if (i >= half_dim || row >= rows) return;
    const long b = row / ((long)heads * seq);
    const long h = (row / seq) % heads;
    const long s = row % seq;
    const long p = s + offsets[offset_off + b * offset_stride];
    if (p < 0 || p >= max_len) {
        if (i == 0) report_check(err, err_code, p, row, max_len);
        return;
    }
#ifdef OUT_AT_POSITION
    const long s_out = p;
#else
    const long s_out = s;
#endif
#if PAIRING == ROPE_HALF
    const long i1 = i, i2 = i + half_dim;
#else
    const long i1 = 2 * (long)i, i2 = 2 * (long)i + 1;
#endif
    const long xb = x_off + b * x_strides.s0 + h * x_strides.s1 + s * x_strides.s2;
    const long ob = out_off + b * out_strides.s0 + h * out_strides.s1 + s_out * out_strides.s2;
    const ACC c = cos_table[p * half_dim + i];
    const ACC sn = direction * sin_table[p * half_dim + i];
    const ACC x1 = LOAD_T(x, xb + i1 * x_strides.s3);
    const ACC x2 = LOAD_T(x, xb + i2 * x_strides.s3);
    STORE_T(out, ob + i1 * out_strides.s3, rope_first(x1, x2, c, sn));
    STORE_T(out, ob + i2 * out_strides.s3, rope_second(x1, x2, c, sn));
}

// A decode step's q, k and v in one launch (rope_qkv_cache): x holds the heads of one stacked projection,
// (B, Hq + 2 Hkv, S, D) through any strides (q's heads, then k's, then v's). q's heads are rotated into
// q_out (B, Hq, S, D); k's are rotated and v's copied into the caches (B, Hkv, capacity, D) at positions
// p = s + offsets[b] (as OUT_AT_POSITION). Needs -DOUT_AT_POSITION off; same checks as rope_rotate.
// Layout: 2-D global (D/2, B*(Hq + 2 Hkv)*S); one work-item moves one pair of one row.
__kernel void rope_qkv_cache(__global const T *x, const long x_off, const long4 x_strides,
                             __global T *q_out, const long q_off, const long4 q_strides,
                             __global T *k_cache, const long k_off, const long4 k_strides,
                             __global T *v_cache, const long v_off, const long4 v_strides,
                             __global const ACC *cos_table, __global const ACC *sin_table,
                             __global const int *offsets, const long offset_off, const int offset_stride,
                             const int q_heads, const int kv_heads, const int seq, const long rows,
                             const int half_dim, const int max_len, __global int *err, const int err_code)
{
    const int i = get_global_id(0);
    const long row = get_global_id(1);
    if (i >= half_dim || row >= rows) return;
    const int heads = q_heads + 2 * kv_heads;
    const long b = row / ((long)heads * seq);
    const int h = (int)((row / seq) % heads);
    const long s = row % seq;
    const long p = s + offsets[offset_off + b * offset_stride];
    if (p < 0 || p >= max_len) {
        if (i == 0) report_check(err, err_code, p, row, max_len);
        return;
    }
#if PAIRING == ROPE_HALF
    const long i1 = i, i2 = i + half_dim;
#else
    const long i1 = 2 * (long)i, i2 = 2 * (long)i + 1;
#endif
    const long xb = x_off + b * x_strides.s0 + h * x_strides.s1 + s * x_strides.s2;
    const ACC x1 = LOAD_T(x, xb + i1 * x_strides.s3);
    const ACC x2 = LOAD_T(x, xb + i2 * x_strides.s3);
    if (h >= q_heads + kv_heads) {  // v: copied into its cache
        const long ob = v_off + b * v_strides.s0 + (h - q_heads - kv_heads) * v_strides.s1 + p * v_strides.s2;
        STORE_T(v_cache, ob + i1 * v_strides.s3, x1);
        STORE_T(v_cache, ob + i2 * v_strides.s3, x2);
        return;
    }
    const ACC c = cos_table[p * half_dim + i];
    const ACC sn = sin_table[p * half_dim + i];
    __global T *out = h < q_heads ? q_out : k_cache;
    const long ob = h < q_heads ? q_off + b * q_strides.s0 + h * q_strides.s1 + s * q_strides.s2
                                : k_off + b * k_strides.s0 + (h - q_heads) * k_strides.s1 + p * k_strides.s2;
    const long os3 = h < q_heads ? q_strides.s3 : k_strides.s3;
    STORE_T(out, ob + i1 * os3, rope_first(x1, x2, c, sn));
    STORE_T(out, ob + i2 * os3, rope_second(x1, x2, c, sn));
}
