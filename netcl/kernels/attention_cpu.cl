// Streaming (flash) attention shaped for CPUs (PoCL): work-group size 1, no local memory, no barriers;
// each work-item keeps a block of rows in private arrays (registers and L1) and walks the keys,
// vectors of 32 bytes (float8 / double4) across every OpenCL library call.
// Masks, kv_len, causal alignment and dropout: attention_common.cl.
//
// attention_forward_cpu: global (ceil(SQ / BQ), HQ, B), local (1, 1, 1). A work-item takes BQ query rows
//   of one head: q rows (times scale) stay in private memory; keys stream in blocks of BK (scores of
//   the block for every row, then the online softmax: running max m and sum l per row, the output
//   accumulator rescaled by exp(m_old - m_new)). Writes out (B, HQ, SQ, D) contiguous and
//   lse = m + log(l) (B, HQ, SQ). Reads q once, k and v once per BQ rows; never more than BQ x BK scores.
// attention_backward_dq_cpu: same grid; writes delta_i = dO_i . out_i (what the dkdv pass reads), then
//   (do_dq) recomputes the scores and p = exp(s - lse) block by block and accumulates
//   dq_i = scale * sum_j p_ij (z_ij dO_i.v_j - delta_i) k_j.
// attention_backward_dkdv_cpu: global (ceil(SK / BKV), HKV, B), local (1, 1, 1). A work-item takes BKV
//   keys of one kv head (k, v rows in private memory) and walks every query row of the GROUP query
//   heads that read them (causal: only rows that can see the block): dv_j += p z dO_i,
//   dk_j += p (z dO_i.v_j - delta_i) scale q_i. No atomics; dk, dv (B, HKV, SK, D) contiguous.
//
// Build options: attention_common.cl's, and
//   BQ   query rows per work-item (forward, dq)                       default 4
//   BK   keys per block of scores (forward, dq; a multiple of 4)      default 16
//   BKV  keys per work-item (dkdv; a multiple of 4)                   default 8

#include "attention_common.cl"

#ifndef BQ
#define BQ 4
#endif
#ifndef BK
#define BK 16
#endif
#ifndef BKV
#define BKV 8
#endif

#if defined(USE_FP64)
#define VW 4
#define accv double4
#define VLOADV(p) vload4(0, (p))
#define VSTOREV(x, p) vstore4((x), 0, (p))
#elif defined(IS_HALF)
#define VW 8
#define accv float8
#define VLOADV(p) vload_half8(0, (p))
#define VSTOREV(x, p) vstore_half8_rte((x), 0, (p))
#else
#define VW 8
#define accv float8
#define VLOADV(p) vload8(0, (p))
#define VSTOREV(x, p) vstore8((x), 0, (p))
#endif
#define NV ((HEAD_DIM + VW - 1) / VW)   // vectors per row
#define TAIL (HEAD_DIM % VW)              // elements in a partial last vector (0: none)

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

inline ACC hsum(const accv x)
{
#if VW == 8
    const float4 a = x.lo + x.hi;
    const float2 c = a.lo + a.hi;
    return c.x + c.y;
#else
    const double2 a = x.lo + x.hi;
    return a.x + a.y;
#endif
}

#define KV_ARGS(n) __global const T *n, const long n##_off, const long n##_sb, const long n##_sh, const long n##_ss
#define MASK_ARGS __global const MASK_T *mask, const long mask_off, const long mask_sb, const long mask_sh, \
                  const long mask_si, const long mask_sj
#define LEN_ARGS __global const int *kv_len, const long kv_len_off, const int has_kv_len, const long kv_len_stride
#define DROP_ARGS const uint drop_threshold, const ACC drop_scale, const uint seed_lo, const uint seed_hi, \
                  const ulong counter0

__kernel void attention_forward_cpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), MASK_ARGS, LEN_ARGS,
                                    __global T *out, __global ACC *lse, const int HQ, const int GROUP,
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
        ACC s[BQ][BK];
        for (int jj = 0; jj < BK; ++jj) {
            if (jj < nk) {
                const int j = j0 + jj;
                const __global T *krow = kb + j * k_ss;
                accv kv[NV];
                for (int c = 0; c < NV; ++c) kv[c] = load_vec(krow, c);
                for (int r = 0; r < BQ; ++r) {
                    accv acc = qr[r][0] * kv[0];
                    for (int c = 1; c < NV; ++c) acc += qr[r][c] * kv[c];
                    const int i = min(i0 + r, SQ - 1);
                    s[r][jj] = masked_score(hsum(acc), i, j, L, SQ, causal, mask, mbase + i * mask_si + j * mask_sj);
                }
            } else {
                for (int r = 0; r < BQ; ++r) s[r][jj] = -INFINITY;
            }
        }
        // online softmax: s becomes the unnormalised probabilities of this block
        for (int r = 0; r < BQ; ++r) {
            ACC mx = m[r];
            for (int jj = 0; jj < BK; ++jj) mx = fmax(mx, s[r][jj]);
            if (mx == -INFINITY) {  // nothing allowed so far
                for (int jj = 0; jj < BK; ++jj) s[r][jj] = (ACC)0;
                continue;
            }
            const ACC alpha = exp(m[r] - mx);
            ACC ps = (ACC)0;
            for (int jj = 0; jj < BK; ++jj) {
                const ACC p = exp(s[r][jj] - mx);
                s[r][jj] = p;
                ps += p;
            }
            m[r] = mx;
            l[r] = l[r] * alpha + ps;
            for (int c = 0; c < NV; ++c) o[r][c] *= alpha;
        }
        if (drop_threshold) {
            for (int r = 0; r < BQ; ++r)
                for (int jq = 0; jq < BK / 4; ++jq) {
                    ACC z[4];
                    dropout_factors4(z, counter0, row0 + r, (j0 >> 2) + jq, seed_lo, seed_hi, drop_threshold,
                                     drop_scale);
                    for (int t = 0; t < 4; ++t) s[r][4 * jq + t] *= z[t];
                }
        }
        for (int jj = 0; jj < nk; ++jj) {
            const __global T *vrow = vb + (j0 + jj) * v_ss;
            accv vv[NV];
            for (int c = 0; c < NV; ++c) vv[c] = load_vec(vrow, c);
            for (int r = 0; r < BQ; ++r) {
                const ACC p = s[r][jj];
                for (int c = 0; c < NV; ++c) o[r][c] += p * vv[c];
            }
        }
    }

    for (int r = 0; r < rows; ++r) {
        const ACC inv = l[r] > (ACC)0 ? (ACC)1 / l[r] : (ACC)0;
        __global T *orow = out + (row0 + r) * HEAD_DIM;
        for (int c = 0; c < NV; ++c) store_vec(orow, c, o[r][c] * inv);
        lse[row0 + r] = l[r] > (ACC)0 ? m[r] + log(l[r]) : -INFINITY;
    }
}

__kernel void attention_backward_dq_cpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                        MASK_ARGS, LEN_ARGS, __global const ACC *lse, __global ACC *delta,
                                        __global T *dq, const int do_dq, const int HQ, const int GROUP,
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
        ACC z[BQ][BK];
        if (drop_threshold) {
            for (int r = 0; r < BQ; ++r)
                for (int jq = 0; jq < BK / 4; ++jq)
                    dropout_factors4(&z[r][4 * jq], counter0, row0 + r, (j0 >> 2) + jq, seed_lo, seed_hi,
                                     drop_threshold, drop_scale);
        }
        for (int jj = 0; jj < nk; ++jj) {
            const int j = j0 + jj;
            const __global T *krow = kb + j * k_ss;
            const __global T *vrow = vb + j * v_ss;
            accv kv[NV], vv[NV];
            for (int c = 0; c < NV; ++c) {
                kv[c] = load_vec(krow, c);
                vv[c] = load_vec(vrow, c);
            }
            for (int r = 0; r < BQ; ++r) {
                accv acc = qr[r][0] * kv[0], accp = gr[r][0] * vv[0];
                for (int c = 1; c < NV; ++c) {
                    acc += qr[r][c] * kv[c];
                    accp += gr[r][c] * vv[c];
                }
                const int i = min(i0 + r, SQ - 1);
                const ACC s = masked_score(hsum(acc), i, j, L, SQ, causal, mask, mbase + i * mask_si + j * mask_sj);
                if (s == -INFINITY || lse_r[r] == -INFINITY) continue;
                const ACC p = exp(s - lse_r[r]);
                ACC dp = hsum(accp);
                if (drop_threshold) dp *= z[r][jj];
                const ACC ds = p * (dp - delta_r[r]);
                for (int c = 0; c < NV; ++c) dqa[r][c] += ds * kv[c];
            }
        }
    }

    for (int r = 0; r < rows; ++r) {
        __global T *drow = dq + (row0 + r) * HEAD_DIM;
        for (int c = 0; c < NV; ++c) store_vec(drow, c, dqa[r][c] * scale);
    }
}

__kernel void attention_backward_dkdv_cpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                          MASK_ARGS,
                                          LEN_ARGS, __global const ACC *lse, __global const ACC *delta,
                                          __global T *dk, __global T *dv, const int HQ, const int GROUP,
                                          const int SQ, const int SK, const int causal, const ACC scale,
                                          DROP_ARGS)
{
    const int j0 = get_global_id(0) * BKV, hk = get_global_id(1), b = get_global_id(2);
    if (j0 >= SK) return;
    const int nkeys = min(BKV, SK - j0);
    const int HKV = HQ / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const __global T *kb = k + k_off + b * k_sb + hk * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hk * v_sh;

    accv kr[BKV][NV], vr[BKV][NV], dka[BKV][NV], dva[BKV][NV];
    for (int jj = 0; jj < BKV; ++jj) {
        const int j = min(j0 + jj, SK - 1);
        for (int c = 0; c < NV; ++c) {
            kr[jj][c] = load_vec(kb + j * k_ss, c);
            vr[jj][c] = load_vec(vb + j * v_ss, c);
            dka[jj][c] = (accv)0;
            dva[jj][c] = (accv)0;
        }
    }

    if (j0 < L) {
        // causal: row i sees key j0 only if i >= j0 - (L - SQ)
        const int i_start = causal ? max(0, j0 - (L - SQ)) : 0;
        for (int g = 0; g < GROUP; ++g) {
            const int h = hk * GROUP + g;
            const long rowh = ((long)b * HQ + h) * SQ;
            const long mbase = mask_off + b * mask_sb + h * mask_sh;
            for (int i = i_start; i < SQ; ++i) {
                const ACC lse_i = lse[rowh + i];
                if (lse_i == -INFINITY) continue;
                const ACC delta_i = delta[rowh + i];
                const __global T *qrow = q + q_off + b * q_sb + h * q_sh + i * q_ss;
                const __global T *grow = grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh
                                         + i * grad_out_ss;
                accv qv[NV], gv[NV];
                for (int c = 0; c < NV; ++c) {
                    qv[c] = load_vec(qrow, c) * scale;
                    gv[c] = load_vec(grow, c);
                }
                ACC z[BKV];
                if (drop_threshold)
                    for (int jq = 0; jq < BKV / 4; ++jq)
                        dropout_factors4(&z[4 * jq], counter0, rowh + i, (j0 >> 2) + jq, seed_lo, seed_hi,
                                         drop_threshold, drop_scale);
                for (int jj = 0; jj < BKV; ++jj) {
                    const int j = j0 + jj;
                    accv acc = qv[0] * kr[jj][0], accp = gv[0] * vr[jj][0];
                    for (int c = 1; c < NV; ++c) {
                        acc += qv[c] * kr[jj][c];
                        accp += gv[c] * vr[jj][c];
                    }
                    const ACC s = masked_score(hsum(acc), i, j, L, SQ, causal, mask,
                                               mbase + i * mask_si + min(j, SK - 1) * mask_sj);
                    if (s == -INFINITY) continue;
                    const ACC p = exp(s - lse_i);
                    const ACC zj = drop_threshold ? z[jj] : (ACC)1;
                    const ACC ds = p * (zj * hsum(accp) - delta_i);
                    const ACC pz = p * zj;
                    for (int c = 0; c < NV; ++c) {
                        dva[jj][c] += pz * gv[c];
                        dka[jj][c] += ds * qv[c];
                    }
                }
            }
        }
    }

    const long krow0 = ((long)b * HKV + hk) * SK + j0;
    for (int jj = 0; jj < nkeys; ++jj) {
        for (int c = 0; c < NV; ++c) {
            store_vec(dk + (krow0 + jj) * HEAD_DIM, c, dka[jj][c]);
            store_vec(dv + (krow0 + jj) * HEAD_DIM, c, dva[jj][c]);
        }
    }
}
