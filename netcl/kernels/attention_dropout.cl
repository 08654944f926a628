// The dropout keep-mask of an attention call, written out for inspection and tests (it is S x S: the
// attention kernels themselves regenerate it tile by tile with the same dropout_factors4).
// attention_dropout_keep: global (>= ceil(SK / 4), >= SQ, >= B * HQ), one work-item per (row, 4 keys):
// keep[(bh * SQ + i) * SK + j] = 1 where the probability of query i for key j is kept, 0 where it is
// dropped. Writes SQ * SK bytes per head.

#include "attention_common.cl"

__kernel void attention_dropout_keep(__global uchar *keep, const int BH, const int SQ, const int SK,
                                     const uint drop_threshold, const uint seed_lo, const uint seed_hi,
                                     const ulong counter0)
{
    const int j4 = get_global_id(0), i = get_global_id(1), bh = get_global_id(2);
    if (4 * j4 >= SK || i >= SQ || bh >= BH) return;  // (the launch may round the global size up)
    const long row = (long)bh * SQ + i;
    ACC z[4];
    dropout_factors4(z, counter0, row, j4, seed_lo, seed_hi, drop_threshold, (ACC)1);
    for (int t = 0; t < 4 && 4 * j4 + t < SK; ++t) keep[row * SK + 4 * j4 + t] = z[t] != (ACC)0;
}
