// Streaming (flash) attention shaped for CPUs (PoCL): work-group size 1, no local memory, no barriers;
// each work-item keeps a block of rows in private arrays (registers and L1) and walks the keys,
// vectors of 32 bytes (float8 / double4) across every OpenCL library call.
// Masks, kv_len, causal alignment and dropout: attention_common.cl.
//
// attention_forward_cpu: global (ceil(SQ / BQ), HQ, B), local (1, 1, 1). A work-item takes BQ query rows
//   of one head: q rows (times scale) stay in private memory; keys stream in blocks of BK (scores of
//   the block for every row, then the online softmax: running max m and sum l per row, the output
//   accumulator rescaled by exp(m_old - m_new)). Writes out (B, HQ, SQ, D) at its strides (OUT_ARGS) and
//   lse = m + log(l) (B, HQ, SQ). Reads q once, k and v once per BQ rows; never more than BQ x BK scores.
// attention_backward_dq_cpu: same grid; writes delta_i = dO_i . out_i (what the dkdv pass reads), then
//   (do_dq) recomputes the scores and p = exp(s - lse) block by block and accumulates
//   dq_i = scale * sum_j p_ij (z_ij dO_i.v_j - delta_i) k_j.
// attention_backward_dkdv_cpu: global (ceil(SK / BKV), HKV, B), local (1, 1, 1). A work-item takes BKV
//   keys of one kv head (k, v rows in private memory) and walks the query rows of the GROUP query
//   heads that read them (causal: only rows that can see the block), BI rows at a time: dv_j += p z dO_i,
//   dk_j += p (z dO_i.v_j - delta_i) scale q_i. No atomics; dk, dv (B, HKV, SK, D) in k's and v's memory order (GRAD_ARGS).
//
// Build options: attention_common.cl's, and
//   BQ   query rows per work-item (forward, dq)                                       default 4
//   BK   keys per block of scores (forward, dq; a multiple of the vector width 8/4)   default 16
//   BKV  keys per work-item (dkdv; a multiple of the vector width)                    default 16
//   BI   query rows per step of the dkdv walk (rank-BI updates of dk, dv)              default 4
// Scores are computed VW keys at a time (VW = 8 floats or 4 doubles): VW dot products summed lane-wise
// into one vector by a transpose-add tree, so masks, exp and dropout run on vectors.

#include "attention_common.cl"

#ifndef BQ
#define BQ 4
#endif
#ifndef BK
#define BK 16
#endif
#ifndef BKV
#define BKV 16
#endif
#ifndef BI
#define BI 4
#endif

#if defined(USE_FP64)
#define VW 4
#define accv double4
#define maskv long4
#define LANE_IDS ((long4)(0, 1, 2, 3))
#define VLOADV(p) vload4(0, (p))
#define VSTOREV(x, p) vstore4((x), 0, (p))
#elif defined(IS_HALF)
#define VW 8
#define accv float8
#define maskv int8
#define LANE_IDS ((int8)(0, 1, 2, 3, 4, 5, 6, 7))
#define VLOADV(p) vload_half8(0, (p))
#define VSTOREV(x, p) vstore_half8((x), 0, (p))
#elif defined(IS_BF16)
#define VW 8
#define accv float8
#define maskv int8
#define LANE_IDS ((int8)(0, 1, 2, 3, 4, 5, 6, 7))
#define VLOADV(p) as_float8(convert_uint8(vload8(0, (p))) << 16)
#define VSTOREV(x, p) vstore8(nc_float8_to_bf16(x), 0, (p))
// eight bfloat16 roundings at once (nc_float_to_bf16's rule: to nearest even, NaN kept quiet)
inline ushort8 nc_float8_to_bf16(const float8 f)
{
    const uint8 u = as_uint8(f);
    const uint8 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return convert_ushort8(select(r, (u >> 16) | 0x40u, isnan(f)));
}
#else
#define VW 8
#define accv float8
#define maskv int8
#define LANE_IDS ((int8)(0, 1, 2, 3, 4, 5, 6, 7))
#define VLOADV(p) vload8(0, (p))
#define VSTOREV(x, p) vstore8((x), 0, (p))
#endif
#define NV ((HEAD_DIM + VW - 1) / VW)   // vectors per row
#define TAIL (HEAD_DIM % VW)              // elements in a partial last vector (0: none)
#define KVEC (BK / VW)                    // score vectors per key block (forward, dq)
#define KVECS (BKV / VW)                  // score vectors per key block (dkdv)

typedef union { accv v; ACC s[VW]; } lanes;

inline accv load_vec(__global const T *row, const int c)
{
#if TAIL
    if (c == NV - 1) {
        lanes u;
        u.v = (accv)0;
        for (int t = 0; t < TAIL; ++t) u.s[t] = LDS(row, c * VW + t);
        return u.v;
    }
#endif
    return VLOADV(row + c * VW);
}

inline void store_vec(__global T *row, const int c, const accv x)
{
#if TAIL
    if (c == NV - 1) {
        lanes u;
        u.v = x;
        for (int t = 0; t < TAIL; ++t) STS(row, c * VW + t, u.s[t]);
        return;
    }
#endif
    VSTOREV(x, row + c * VW);
}

// Lane sums of VW vectors as one vector: result lane t = sum of a[t]'s lanes (a transpose-add tree: no
// horizontal sum per dot product).
#if VW == 8
inline accv pair_sums(const accv x, const accv y)
{
    return (accv)(x.s0246, y.s0246) + (accv)(x.s1357, y.s1357);
}
inline accv lane_sums(const accv *a)
{
    const accv q0 = pair_sums(pair_sums(a[0], a[1]), pair_sums(a[2], a[3]));
    const accv q1 = pair_sums(pair_sums(a[4], a[5]), pair_sums(a[6], a[7]));
    return pair_sums(q0, q1);
}
inline ACC hsum(const accv x)
{
    const float4 a = x.lo + x.hi;
    const float2 c = a.lo + a.hi;
    return c.x + c.y;
}
inline ACC hmax(const accv x)
{
    const float4 a = x.lo > x.hi ? x.lo : x.hi;
    const float2 c = a.lo > a.hi ? a.lo : a.hi;
    return c.x > c.y ? c.x : c.y;
}
#else
inline accv pair_sums(const accv x, const accv y)
{
    return (accv)(x.s02, y.s02) + (accv)(x.s13, y.s13);
}
inline accv lane_sums(const accv *a)
{
    return pair_sums(pair_sums(a[0], a[1]), pair_sums(a[2], a[3]));
}
inline ACC hsum(const accv x)
{
    const double2 a = x.lo + x.hi;
    return a.x + a.y;
}
inline ACC hmax(const accv x)
{
    const double2 a = x.lo > x.hi ? x.lo : x.hi;
    return a.x > a.y ? a.x : a.y;
}
#endif

// Scores of query row i for keys j .. j + VW - 1 (dot products in `sv`) after scale was applied: -inf
// where i may not attend (attention_common.cl's rule, lane by lane; the mask is read only where allowed).
inline accv mask_scores(accv sv, const int i, const int j, const int L, const int SQ, const int causal,
                        __global const MASK_T *mask, const long mrow, const long mask_sj)
{
    const maskv jv = (maskv)(j) + LANE_IDS;
    maskv bad = jv >= (maskv)(L);
    if (causal) bad |= jv > (maskv)(i + L - SQ);
    sv = bad ? (accv)(-INFINITY) : sv;
#if MASK != MASK_NONE
    lanes u;
    u.v = sv;
    for (int t = 0; t < VW; ++t) u.s[t] = masked_score(u.s[t], i, j + t, L, SQ, causal, mask, mrow + (j + t) * mask_sj);
    sv = u.v;
#endif
    return sv;
}

// Dot products of `x` (one row of NV vectors) with the VW packed rows `rows[0 .. VW-1]`, as one vector.
inline accv dots(const accv *x, const accv (*rows)[NV])
{
    accv acc[VW];
#pragma unroll
    for (int t = 0; t < VW; ++t) acc[t] = x[0] * rows[t][0];
#pragma unroll
    for (int c = 1; c < NV; ++c)
#pragma unroll
        for (int t = 0; t < VW; ++t) acc[t] += x[c] * rows[t][c];
    return lane_sums(acc);
}

// Rows first .. first + count - 1 of a (row-strided) operand into private vectors; rows at or past `limit`
// repeat row limit - 1 (their results are masked), so no read leaves the operand.
inline void pack_rows(accv (*dst)[NV], __global const T *base, const long row_stride, const int first,
                      const int count, const int limit)
{
    for (int jj = 0; jj < count; ++jj) {
        const int j = first + jj < limit ? first + jj : limit - 1;
        const __global T *row = base + j * row_stride;
        for (int c = 0; c < NV; ++c) dst[jj][c] = load_vec(row, c);
    }
}

// The dropout multipliers of keys j .. j + VW - 1 (j a multiple of 4) of one row, as a vector.
inline accv dropout_vec(const ulong counter0, const long row, const int j, const uint seed_lo, const uint seed_hi,
                        const uint drop_threshold, const ACC drop_scale)
{
    lanes u;
    for (int t = 0; t < VW; t += 4)
        dropout_factors4(&u.s[t], counter0, row, (j + t) >> 2, seed_lo, seed_hi, drop_threshold, drop_scale);
    return u.v;
}


__kernel void attention_forward_cpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), MASK_ARGS, LEN_ARGS,
                                    OUT_ARGS, __global ACC *lse, const int HQ, const int GROUP,
                                    const int SQ, const int SK, const int causal, const ACC scale, DROP_ARGS)
{
    const int i0 = get_global_id(0) * BQ, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const int rows = min(BQ, SQ - i0), hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, i0 + rows - 1, L, SQ);
    const __global T *kb = k + k_off + b * k_sb + hk * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hk * v_sh;
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const long row0 = ((long)b * HQ + h) * SQ + i0;

    accv qr[BQ][NV], o[BQ][NV];
    ACC m[BQ], l[BQ];
    for (int r = 0; r < BQ; ++r) {
        const int i = min(i0 + r, SQ - 1);  // rows past SQ repeat the last one (not written)
        const __global T *qrow = q + q_off + b * q_sb + h * q_sh + i * q_ss;
        for (int c = 0; c < NV; ++c) {
            qr[r][c] = load_vec(qrow, c) * scale;
            o[r][c] = (accv)0;
        }
        m[r] = -INFINITY;
        l[r] = (ACC)0;
    }

    for (int j0 = 0; j0 < jend; j0 += BK) {
        const int nk = min(BK, jend - j0);
        union { accv v[KVEC]; ACC s[BK]; } p[BQ];
        accv blk[BK][NV];  // this block's k rows, then its v rows
        pack_rows(blk, kb, k_ss, j0, BK, jend);
        for (int jv = 0; jv < KVEC; ++jv) {
            const int j = j0 + jv * VW;
            for (int r = 0; r < BQ; ++r) {
                const int i = i0 + r < SQ ? i0 + r : SQ - 1;
                p[r].v[jv] = mask_scores(dots(qr[r], blk + jv * VW), i, j, L, SQ, causal, mask,
                                         mbase + i * mask_si, mask_sj);
            }
        }
        // online softmax: p becomes this block's unnormalised probabilities
        for (int r = 0; r < BQ; ++r) {
            accv mv = p[r].v[0];
            for (int jv = 1; jv < KVEC; ++jv) mv = mv > p[r].v[jv] ? mv : p[r].v[jv];
            const ACC mb = hmax(mv), mx = m[r] > mb ? m[r] : mb;
            if (mx == -INFINITY) {  // nothing allowed so far
                for (int jv = 0; jv < KVEC; ++jv) p[r].v[jv] = (accv)0;
                continue;
            }
            const ACC alpha = exp(m[r] - mx);
            accv ps = (accv)0;
            for (int jv = 0; jv < KVEC; ++jv) {
                p[r].v[jv] = exp(p[r].v[jv] - (accv)(mx));
                ps += p[r].v[jv];
            }
            m[r] = mx;
            l[r] = l[r] * alpha + hsum(ps);
            for (int c = 0; c < NV; ++c) o[r][c] *= alpha;
            if (drop_threshold)
                for (int jv = 0; jv < KVEC; ++jv)
                    p[r].v[jv] *= dropout_vec(counter0, row0 + r, j0 + jv * VW, seed_lo, seed_hi, drop_threshold,
                                              drop_scale);
        }
        // o += p v, a vector of the head dim at a time over the block's keys
        pack_rows(blk, vb, v_ss, j0, BK, jend);
        for (int c = 0; c < NV; ++c) {
            accv acc[BQ];
#pragma unroll
            for (int r = 0; r < BQ; ++r) acc[r] = o[r][c];
            for (int jj = 0; jj < nk; ++jj) {
                const accv vv = blk[jj][c];
#pragma unroll
                for (int r = 0; r < BQ; ++r) acc[r] += p[r].s[jj] * vv;
            }
#pragma unroll
            for (int r = 0; r < BQ; ++r) o[r][c] = acc[r];
        }
    }

    for (int r = 0; r < rows; ++r) {
        const ACC inv = l[r] > (ACC)0 ? (ACC)1 / l[r] : (ACC)0;
        __global T *orow = OUT_ROW(b, h, i0 + r);
        for (int c = 0; c < NV; ++c) store_vec(orow, c, o[r][c] * inv);
        lse[row0 + r] = l[r] > (ACC)0 ? m[r] + log(l[r]) : -INFINITY;
    }
}

__kernel void attention_backward_dq_cpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                        MASK_ARGS, LEN_ARGS, __global const ACC *lse, __global ACC *delta,
                                        GRAD_ARGS(dq), const int do_dq, const int HQ, const int GROUP,
                                        const int SQ, const int SK, const int causal, const ACC scale, DROP_ARGS)
{
    const int i0 = get_global_id(0) * BQ, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const int rows = min(BQ, SQ - i0), hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, i0 + rows - 1, L, SQ);
    const __global T *kb = k + k_off + b * k_sb + hk * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hk * v_sh;
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const long row0 = ((long)b * HQ + h) * SQ + i0;

    accv qr[BQ][NV], gr[BQ][NV], dqa[BQ][NV];
    ACC lse_r[BQ], delta_r[BQ];
    for (int r = 0; r < BQ; ++r) {
        const int i = min(i0 + r, SQ - 1);
        const __global T *qrow = q + q_off + b * q_sb + h * q_sh + i * q_ss;
        const __global T *grow = grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh + i * grad_out_ss;
        const __global T *orow = out + out_off + b * out_sb + h * out_sh + i * out_ss;
        accv dot = (accv)0;
        for (int c = 0; c < NV; ++c) {
            qr[r][c] = load_vec(qrow, c) * scale;
            gr[r][c] = load_vec(grow, c);
            dot += gr[r][c] * load_vec(orow, c);
            dqa[r][c] = (accv)0;
        }
        lse_r[r] = r < rows ? lse[row0 + r] : -INFINITY;
        delta_r[r] = hsum(dot);
        if (r < rows) delta[row0 + r] = delta_r[r];
    }
    if (!do_dq) return;

    for (int j0 = 0; j0 < jend; j0 += BK) {
        const int nk = min(BK, jend - j0);
        union { accv v[KVEC]; ACC s[BK]; } ds[BQ];
        accv kblk[BK][NV], vblk[BK][NV];
        pack_rows(kblk, kb, k_ss, j0, BK, jend);
        pack_rows(vblk, vb, v_ss, j0, BK, jend);
        for (int jv = 0; jv < KVEC; ++jv) {
            const int j = j0 + jv * VW;
            for (int r = 0; r < BQ; ++r) {
                const int i = i0 + r < SQ ? i0 + r : SQ - 1;
                const accv s = mask_scores(dots(qr[r], kblk + jv * VW), i, j, L, SQ, causal, mask,
                                           mbase + i * mask_si, mask_sj);
                // p = 0 where masked (exp(-inf)) and on rows with no key (lse = -inf)
                const accv p = lse_r[r] == -INFINITY ? (accv)0 : exp(s - (accv)(lse_r[r]));
                accv dp = dots(gr[r], vblk + jv * VW);
                if (drop_threshold)
                    dp *= dropout_vec(counter0, row0 + r, j, seed_lo, seed_hi, drop_threshold, drop_scale);
                ds[r].v[jv] = p * (dp - (accv)(delta_r[r]));
            }
        }
        for (int c = 0; c < NV; ++c) {
            accv acc[BQ];
#pragma unroll
            for (int r = 0; r < BQ; ++r) acc[r] = dqa[r][c];
            for (int jj = 0; jj < nk; ++jj) {
                const accv kv = kblk[jj][c];
#pragma unroll
                for (int r = 0; r < BQ; ++r) acc[r] += ds[r].s[jj] * kv;
            }
#pragma unroll
            for (int r = 0; r < BQ; ++r) dqa[r][c] = acc[r];
        }
    }

    for (int r = 0; r < rows; ++r) {
        __global T *drow = GRAD_ROW(dq, b, h, i0 + r);
        for (int c = 0; c < NV; ++c) store_vec(drow, c, dqa[r][c] * scale);
    }
}

__kernel void attention_backward_dkdv_cpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                          MASK_ARGS, LEN_ARGS, __global const ACC *lse, __global const ACC *delta,
                                          GRAD_ARGS(dk), GRAD_ARGS(dv), const int HQ, const int GROUP,
                                          const int SQ, const int SK, const int causal, const ACC scale,
                                          DROP_ARGS)
{
    const int j0 = get_global_id(0) * BKV, hk = get_global_id(1), b = get_global_id(2);
    if (j0 >= SK) return;
    const int nkeys = min(BKV, SK - j0);
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const __global T *kb = k + k_off + b * k_sb + hk * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hk * v_sh;

    accv dka[BKV][NV], dva[BKV][NV];
    for (int jj = 0; jj < BKV; ++jj)
        for (int c = 0; c < NV; ++c) {
            dka[jj][c] = (accv)0;
            dva[jj][c] = (accv)0;
        }

    if (j0 < L) {
        accv kr[BKV][NV], vr[BKV][NV];
        pack_rows(kr, kb, k_ss, j0, BKV, SK);
        pack_rows(vr, vb, v_ss, j0, BKV, SK);
        // causal: row i sees key j0 only if i >= j0 - (L - SQ)
        const int i_start = causal ? max(0, j0 - (L - SQ)) : 0;
        for (int g = 0; g < GROUP; ++g) {
            const int h = hk * GROUP + g;
            const long rowh = ((long)b * HQ + h) * SQ;
            const long mbase = mask_off + b * mask_sb + h * mask_sh;
            for (int i0 = i_start; i0 < SQ; i0 += BI) {
                accv qv[BI][NV], gv[BI][NV];
                union { accv v[KVECS]; ACC s[BKV]; } pz[BI], ds[BI];
                for (int ii = 0; ii < BI; ++ii) {
                    const int i = i0 + ii < SQ ? i0 + ii : SQ - 1;
                    const __global T *qrow = q + q_off + b * q_sb + h * q_sh + i * q_ss;
                    const __global T *grow = grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh
                                             + i * grad_out_ss;
                    for (int c = 0; c < NV; ++c) {
                        qv[ii][c] = load_vec(qrow, c) * scale;
                        gv[ii][c] = load_vec(grow, c);
                    }
                    const ACC lse_i = i0 + ii < SQ ? lse[rowh + i] : -INFINITY;
                    if (lse_i == -INFINITY) {  // a row past SQ, or one that attends nothing
                        for (int jv = 0; jv < KVECS; ++jv) pz[ii].v[jv] = ds[ii].v[jv] = (accv)0;
                        continue;
                    }
                    const ACC delta_i = delta[rowh + i];
                    for (int jv = 0; jv < KVECS; ++jv) {
                        const int j = j0 + jv * VW;
                        const accv s = mask_scores(dots(qv[ii], kr + jv * VW), i, j, L, SQ, causal, mask,
                                                   mbase + i * mask_si, mask_sj);
                        const accv p = exp(s - (accv)(lse_i));
                        accv z = (accv)1;
                        if (drop_threshold)
                            z = dropout_vec(counter0, rowh + i, j, seed_lo, seed_hi, drop_threshold, drop_scale);
                        pz[ii].v[jv] = p * z;
                        ds[ii].v[jv] = p * (z * dots(gv[ii], vr + jv * VW) - (accv)(delta_i));
                    }
                }
                // dv += p^T dO, dk += ds^T (scale q): BI rows per accumulator update
                for (int jj = 0; jj < BKV; ++jj)
                    for (int c = 0; c < NV; ++c) {
                        accv a = dva[jj][c], d = dka[jj][c];
#pragma unroll
                        for (int ii = 0; ii < BI; ++ii) {
                            a += pz[ii].s[jj] * gv[ii][c];
                            d += ds[ii].s[jj] * qv[ii][c];
                        }
                        dva[jj][c] = a;
                        dka[jj][c] = d;
                    }
            }
        }
    }

    for (int jj = 0; jj < nkeys; ++jj) {
        for (int c = 0; c < NV; ++c) {
            store_vec(GRAD_ROW(dk, b, hk, j0 + jj), c, dka[jj][c]);
            store_vec(GRAD_ROW(dv, b, hk, j0 + jj), c, dva[jj][c]);
        }
    }
}
