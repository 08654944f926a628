// Streaming (flash) attention for float32 inputs on NVIDIA's TF32 matrix units at float32's accuracy: every
// product x y runs as three mma.sync m16n8k8 TF32 (x_lo y_hi + x_hi y_lo + x_hi y_hi, with x_hi = x rounded to
// TF32's 10-bit mantissa and x_lo = x - x_hi rounded again: about 21 bits of each operand, the dropped x_lo y_lo
// ~2^-22 of the product), CUTLASS's 3xTF32 (OpMultiplyAddFastF32), the scheme PyTorch's float32 SDPA (its
// memory-efficient kernel) runs on sm_80 and later. The online softmax, masks, kv_len, causal alignment and
// dropout are attention_mma.cl's (attention_common.cl's rules), in float32 registers.
//
// Fragments (mma.sync m16n8k8 TF32; g = lane / 4, t = lane % 4): A (16 x 8) a0 (g, t) a1 (g + 8, t) a2 (g, t + 4)
// a3 (g + 8, t + 4); B (8 x 8, k x n) b0 (t, g) b1 (t + 4, g); accumulators c0, c1 (g, 2t .. 2t + 1), c2, c3
// (g + 8, 2t ..). A tile row-major in local memory gives the A fragments of its rows and the B fragments of
// q k^T-like products (its rows on the n side) by ldmatrix (16-byte rows seen as 8 x 4 matrices of 32-bit
// values, mma_sync.cl's LDSM). A product whose k side is the accumulators' column side (p v, ds k, (p z)^T dO,
// ds^T q) takes the accumulators of an 8-column block as its A fragment with the columns relabeled (A column t
// is column 2t, A column t + 4 is column 2t + 1: no shuffle) and reads its B rows 2t and 2t + 1 of the tile
// with plain loads (rows of HEAD_DIM + 4 floats: the 32 lanes' loads fall on 32 banks).
//
// attention_forward_tf32: global (ceil(SQ / BM) * THREADS, HQ, B), BM = 16 WARPS query rows (warp w: rows
//   16w .. 16w + 15, q's fragments split in registers). Key tiles of BN rows of k and v through a two-stage
//   cp.async ring (tile n + 1 in flight while tile n is computed; q's rows pass through the ring's memory
//   first): s = q k^T, scale and mask, row maxima over the quad, p = exp(s - m), rescaled sums and outputs,
//   o += p v. Out = o / l, lse = m + log(l) (-inf and 0 for a row that may see no key).
// attention_backward_dq_tf32: global (ceil(SQ / BM) * THREADS, HQ, B). delta = rowsum(dO * out) of the
//   work-group's rows (written: the dk/dv pass reads it); then, when do_dq, q's and dO's fragments in registers
//   and per key tile (the ring as the forward's): s = q k^T, dp = dO v^T, p = exp(s - lse), ds = p (z dp -
//   delta), dq += ds k; dq = scale dq.
// attention_backward_dkdv_tf32: global (ceil(SK / KEYS) * THREADS, HKV, B), KEYS = 16 WARPS keys (warp w: keys
//   16w .., k's and v's fragments in registers). It walks the query tiles of BQ rows of the GROUP heads that
//   can see its keys (q, dO tiles and their lse and delta through a two-stage cp.async ring): s^T = k q^T,
//   dp^T = v dO^T, p^T, ds^T, dv += (p z)^T dO, dk += ds^T q; dk = scale dk. No atomics anywhere: the same
//   bits on every run.
//
// Build options: attention_common.cl's (T float), HEAD_DIM (a multiple of 8 up to 64), WARPS, BN (forward and
// dq: keys a tile, a multiple of 16, BM <= 2 BN), BQ (dk/dv: query rows a tile, a multiple of 16, KEYS <=
// 2 BQ), MMA_PASS (1 forward, 2 dq, 3 dk/dv: the one kernel a program holds), NATIVE_EXP, MMA_EMULATE (mma,
// ldmatrix, cp.async and the shuffles emulated through local memory: tests on any device). Rows of q, k, v,
// dO and out start on 16-byte boundaries (the host checks). Local memory: 4 BN (DK/DV: 4 BQ) rows of
// HEAD_DIM + 4 floats, and 2 BM (4 BQ) floats of lse and delta.

#include "attention_common.cl"

#define MMA_TF32
#define KSTEP 8
#include "mma_sync.cl"
#include "attention_frag.cl"

#ifndef WARPS
#define WARPS 4
#endif
#ifndef BN
#define BN 32
#endif
#ifndef BQ
#define BQ 32
#endif
#ifndef MMA_PASS
#define MMA_PASS 1
#endif
#define THREADS (WARPS * 32)
#define BM (WARPS * 16)          // query rows of a forward or dq work-group
#define KEYS (WARPS * 16)        // keys of a dk/dv work-group
#define DPADF (HEAD_DIM + 4)     // a local row, floats
#define DK8 (HEAD_DIM / 8)       // k steps along the head dim
#define DB (HEAD_DIM / 8)        // 8-column blocks of an output row
#define CH4 (HEAD_DIM / 4)       // 16-byte chunks of a row
#define NB (BN / 8)              // 8-key blocks of a key tile
#define QB (BQ / 8)              // 8-query blocks of a query tile
#if (HEAD_DIM % 8) || HEAD_DIM > 64 || (BN % 16) || (BQ % 16) || (MMA_PASS != 3 && BM > 2 * BN) \
    || (MMA_PASS == 3 && KEYS > 2 * BQ)
#error "attention_tf32.cl: HEAD_DIM a multiple of 8 up to 64, BN and BQ multiples of 16, 16 WARPS <= 2 BN (2 BQ)"
#endif

// x rounded to TF32 (nearest, ties away), as cvt.rna.tf32.f32 (gemm_mma_tile.cl's rounding)
#ifdef MMA_EMULATE
inline uint tf32_rna(const float x) { return (as_uint(x) + 0x1000u) & 0xffffe000u; }
#else
inline uint tf32_rna(const float x) {
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
#endif
// hi + lo = x to ~21 bits, both TF32
#define SPLIT(hi, lo, x)                                                                                \
    do {                                                                                                \
        const float x_ = (x);                                                                           \
        hi = tf32_rna(x_);                                                                              \
        lo = tf32_rna(x_ - as_float(hi));                                                               \
    } while (0)
// d += a b in three TF32 products, the small ones first
#define MMA3(d, ah, al, bh, bl)                                                                         \
    do {                                                                                                \
        MMA(d, al, bh, d);                                                                              \
        MMA(d, ah, bl, d);                                                                              \
        MMA(d, ah, bh, d);                                                                              \
    } while (0)
// an A fragment's four registers split
#define SPLIT_A(hi, lo, a)                                                                              \
    do {                                                                                                \
        SPLIT(hi[0], lo[0], as_float(a[0])); SPLIT(hi[1], lo[1], as_float(a[1]));                       \
        SPLIT(hi[2], lo[2], as_float(a[2])); SPLIT(hi[3], lo[3], as_float(a[3]));                       \
    } while (0)
// the accumulators c[4] of an 8-column block as the A fragment of the k step over those columns (A column t:
// column 2t, A column t + 4: column 2t + 1), split
#define SPLIT_ACC_A(hi, lo, c)                                                                          \
    do {                                                                                                \
        SPLIT(hi[0], lo[0], c[0]); SPLIT(hi[1], lo[1], c[2]);                                           \
        SPLIT(hi[2], lo[2], c[1]); SPLIT(hi[3], lo[3], c[3]);                                           \
    } while (0)

// ldmatrix row addresses by lane LN, 32-bit words: the A fragment of rows r0 .. r0 + 15 at k step kk; the B
// fragments of two 8-row blocks jb, jb + 1 (their rows the n side) at k step kk
#define A_ROWS(tile, r0, LN) ((__local uint *)(tile) + ((r0) + ((LN) & 15)) * DPADF + kk * 8 + ((LN) >> 4) * 4)
#define B_ROWS(tile, LN) ((__local uint *)(tile) + (jb * 8 + ((LN) >> 4) * 8 + ((LN) & 7)) * DPADF + kk * 8      \
                          + (((LN) >> 3) & 1) * 4)

// acc[NBLK][4] += A (16 x HEAD_DIM, raw fragments a[DK8][4], split once a k step) times the rows of a local tile
// as B (its rows the n side): NT_ROWS(L) the ldmatrix addresses of (jb, kk). Two products over one A share its
// split: NT3_2 (acc1 from a1 and tile rows ROWS1, acc2 from a2 and ROWS2).
#define NT3(acc, a, NBLK, ROWS)                                                                         \
    MMA_UNROLL                                                                                          \
    for (int kk = 0; kk < DK8; ++kk) {                                                                  \
        uint ah_[4], al_[4];                                                                            \
        SPLIT_A(ah_, al_, a[kk]);                                                                       \
        MMA_UNROLL                                                                                      \
        for (int jb = 0; jb < (NBLK); jb += 2) {                                                        \
            uint r_[4], b0h_[2], b0l_[2], b1h_[2], b1l_[2];                                             \
            LDSM(r_, ROWS, false);                                                                      \
            SPLIT(b0h_[0], b0l_[0], as_float(r_[0])); SPLIT(b0h_[1], b0l_[1], as_float(r_[1]));         \
            SPLIT(b1h_[0], b1l_[0], as_float(r_[2])); SPLIT(b1h_[1], b1l_[1], as_float(r_[3]));         \
            MMA3(acc[jb], ah_, al_, b0h_, b0l_);                                                        \
            MMA3(acc[jb + 1], ah_, al_, b1h_, b1l_);                                                    \
        }                                                                                               \
    }
// acc[DB][4] += C (16 x 8 NBLK accumulators c[NBLK][4], the k side their columns) times rows 0 .. 8 NBLK - 1 of
// a local tile (the k side its rows, the n side the head dim)
#define KN3(acc, c, NBLK, tile)                                                                         \
    MMA_UNROLL                                                                                          \
    for (int jb = 0; jb < (NBLK); ++jb) {                                                               \
        uint ah_[4], al_[4];                                                                            \
        SPLIT_ACC_A(ah_, al_, c[jb]);                                                                   \
        __local const float *const r_ = (tile) + (jb * 8 + 2 * t) * DPADF + g;                          \
        MMA_UNROLL                                                                                      \
        for (int db = 0; db < DB; ++db) {                                                               \
            uint bh_[2], bl_[2];                                                                        \
            SPLIT(bh_[0], bl_[0], r_[db * 8]);                                                          \
            SPLIT(bh_[1], bl_[1], r_[DPADF + db * 8]);                                                  \
            MMA3(acc[db], ah_, al_, bh_, bl_);                                                          \
        }                                                                                               \
    }

// rows first .. first + count - 1 of an operand (row stride in elements) into local rows of DPADF floats, 16
// bytes a copy: plain loads (load_rows_f) or cp.async (issue_rows_f, landed by CP_WAIT1); rows at or past
// `limit` are zeros
inline void load_rows_f(__local float *dst, __global const float *base, const long row_stride, const int first,
                        const int count, const int limit, const int tid) {
    for (int c = tid; c < count * CH4; c += THREADS) {
        const int r = c / CH4, ch = c - r * CH4;
        float4 x = (float4)(0.0f);
        if (first + r < limit) x = vload4(0, base + (first + r) * row_stride + ch * 4);
        vstore4(x, 0, dst + r * DPADF + ch * 4);
    }
}
inline void issue_rows_f(__local float *dst, __global const float *base, const long row_stride, const int first,
                         const int count, const int limit, const int tid) {
    for (int c = tid; c < count * CH4; c += THREADS) {
        const int r = c / CH4, ch = c - r * CH4;
        const bool in = first + r < limit;
        nc_cp_async16(dst + r * DPADF + ch * 4, in ? base + (first + r) * row_stride + ch * 4 : base, in ? 16 : 0);
    }
}

// the raw A fragments a[DK8][4] of 16 rows of a local tile from `rows` (the warp's first), k step by k step
inline void warp_fragments(uint a[DK8][4], __local float *rows, const int lane) {
    const int g = lane >> 2, t = lane & 3;
    (void)g; (void)t;   // (the emulated ldmatrix's lane coordinates)
#define WARP_ROWS_(LN) A_ROWS(rows, 0, LN)
    MMA_UNROLL
    for (int kk = 0; kk < DK8; ++kk) LDSM(a[kk], WARP_ROWS_, false);
#undef WARP_ROWS_
}

// the accumulators' two rows r (0: g, 1: g + 8) times mul into row `row` of a float operand
inline void store_acc_row(__global float *row, const float acc[DB][4], const int r, const float mul, const int t) {
    #pragma unroll
    for (int db = 0; db < DB; ++db)
        vstore2((float2)(acc[db][2 * r] * mul, acc[db][2 * r + 1] * mul), 0, row + db * 8 + 2 * t);
}

#ifdef MMA_EMULATE
#define EMULATION_SCRATCH __local float scratch_a[WARPS * 16 * KSTEP], scratch_b[WARPS * KSTEP * 8], shx[THREADS]
#else
#define EMULATION_SCRATCH
#endif

#if MMA_PASS == 1
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_forward_tf32(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), MASK_ARGS, LEN_ARGS, OUT_ARGS,
                            __global float *lse, const int HQ, const int GROUP, const int SQ, const int SK,
                            const int causal, const float scale, DROP_ARGS)
{
    __local float4 ring4[4 * BN * DPADF / 4];   // k's two stages, then v's
    __local float *const ring = (__local float *)ring4;
    EMULATION_SCRATCH;
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int i0 = get_group_id(0) * BM, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const int hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, min(i0 + BM, SQ) - 1, L, SQ);
    __global const float *const kb = k + k_off + b * k_sb + hk * k_sh;
    __global const float *const vb = v + v_off + b * v_sb + hk * v_sh;
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const long row0 = ((long)b * HQ + h) * SQ + i0;
    const int rloc[2] = {warp * 16 + g, warp * 16 + g + 8};
    const int irow[2] = {min(i0 + rloc[0], SQ - 1), min(i0 + rloc[1], SQ - 1)};

    // q's fragments, split once (through the ring's memory)
    uint qh[DK8][4], ql[DK8][4];
    load_rows_f(ring, q + q_off + b * q_sb + h * q_sh, q_ss, i0, BM, SQ, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    warp_fragments(qh, ring + warp * 16 * DPADF, lane);
    MMA_UNROLL
    for (int kk = 0; kk < DK8; ++kk) SPLIT_A(qh[kk], ql[kk], qh[kk]);
    float o[DB][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    ZERO_ACC(o, DB);

    barrier(CLK_LOCAL_MEM_FENCE);   // q's rows are read: the ring's memory is free
    if (jend > 0) {
        issue_rows_f(ring, kb, k_ss, 0, BN, jend, tid);
        issue_rows_f(ring + 2 * BN * DPADF, vb, v_ss, 0, BN, jend, tid);
    }
    CP_COMMIT();
    for (int j0 = 0, it = 0; j0 < jend; j0 += BN, ++it) {
        __local float *const ks = ring + (it & 1) * BN * DPADF, *const vs = ks + 2 * BN * DPADF;
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp is done with tile it - 1: its stage is free
        if (j0 + BN < jend) {
            __local float *const kn = ring + ((it + 1) & 1) * BN * DPADF;
            issue_rows_f(kn, kb, k_ss, j0 + BN, BN, jend, tid);
            issue_rows_f(kn + 2 * BN * DPADF, vb, v_ss, j0 + BN, BN, jend, tid);
        }
        CP_COMMIT();
        CP_WAIT1();                     // this work-item's copies of tile it have landed
        barrier(CLK_LOCAL_MEM_FENCE);   // ... and everyone's

        float s[NB][4];
        ZERO_ACC(s, NB);
        // (NT3's loop with q's fragments split once, before the tiles)
        MMA_UNROLL
        for (int kk = 0; kk < DK8; ++kk)
            MMA_UNROLL
            for (int jb = 0; jb < NB; jb += 2) {
                uint r_[4], b0h_[2], b0l_[2], b1h_[2], b1l_[2];
#define K_ROWS(LN) B_ROWS(ks, LN)
                LDSM(r_, K_ROWS, false);
#undef K_ROWS
                SPLIT(b0h_[0], b0l_[0], as_float(r_[0])); SPLIT(b0h_[1], b0l_[1], as_float(r_[1]));
                SPLIT(b1h_[0], b1l_[0], as_float(r_[2])); SPLIT(b1h_[1], b1l_[1], as_float(r_[3]));
                MMA3(s[jb], qh[kk], ql[kk], b0h_, b0l_);
                MMA3(s[jb + 1], qh[kk], ql[kk], b1h_, b1l_);
            }

        // scale (here, or in the exponent: sc), mask, the rows' maxima over the tile
        float sc = 1.0f;
        if (!open_tile(j0, BN, i0, L, SQ, causal)) {
            SCALE_ACC(s, NB, scale);
            MASK_ROWS(s, irow);
        } else if (EXP_FUSED && scale > 0.0f) {
            sc = scale;   // the maxima of unscaled scores, scaled after
        } else {
            SCALE_ACC(s, NB, scale);
        }
        float mx[2] = {-INFINITY, -INFINITY};
        #pragma unroll
        for (int jb = 0; jb < NB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) mx[e >> 1] = fmax(mx[e >> 1], s[jb][e]);
        float alpha[2];
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            QUAD_MAX(mx[r]);
            mx[r] = fmax(m[r], mx[r] * sc);
            alpha[r] = mx[r] == -INFINITY ? 1.0f : EXPF(m[r] - mx[r]);   // 1 while nothing is allowed yet
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
        #pragma unroll
        for (int db = 0; db < DB; ++db) {
            o[db][0] *= alpha[0]; o[db][1] *= alpha[0];
            o[db][2] *= alpha[1]; o[db][3] *= alpha[1];
        }
#if EXP_FUSED
        const float c = sc * LOG2E;
        const float mb[2] = {m[0] == -INFINITY ? 0.0f : m[0] * LOG2E, m[1] == -INFINITY ? 0.0f : m[1] * LOG2E};
        #pragma unroll
        for (int jb = 0; jb < NB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = EXP2F(fma(s[jb][e], c, -mb[e >> 1]));
                l[e >> 1] += p;
                s[jb][e] = p;
            }
#else
        #pragma unroll
        for (int jb = 0; jb < NB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = s[jb][e] == -INFINITY ? 0.0f : EXPF(s[jb][e] - m[e >> 1]);
                l[e >> 1] += p;
                s[jb][e] = p;
            }
#endif
        if (drop_threshold) DROP_ROWS(s, s, rloc);
        KN3(o, s, NB, vs);   // o += p v
    }

    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        float lr = l[r];
        QUAD_SUM(lr);
        if (i0 + rloc[r] >= SQ) continue;
        const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
        store_acc_row(OUT_ROW(b, h, i0 + rloc[r]), o, r, inv, t);
        if (t == 0) lse[row0 + rloc[r]] = lr > 0.0f ? m[r] + log(lr) : -INFINITY;
    }
}
#endif

#if MMA_PASS == 2
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_backward_dq_tf32(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out), MASK_ARGS,
                                LEN_ARGS, __global const float *lse, __global float *delta, GRAD_ARGS(dq),
                                const int do_dq, const int HQ, const int GROUP, const int SQ, const int SK,
                                const int causal, const float scale, DROP_ARGS)
{
    __local float4 ring4[4 * BN * DPADF / 4];   // k's two stages, then v's
    __local float *const ring = (__local float *)ring4;
    __local float rowv[2 * BM];                  // lse, then delta of the work-group's rows
    EMULATION_SCRATCH;
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int i0 = get_group_id(0) * BM, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const long row0 = ((long)b * HQ + h) * SQ + i0;
    __global const float *const grow = grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh;
    __global const float *const orow = out + out_off + b * out_sb + h * out_sh;
    for (int r = tid; r < BM; r += THREADS) {
        float d = 0.0f;
        if (i0 + r < SQ) {
            for (int c4 = 0; c4 < CH4; ++c4)
                d += dot(vload4(0, grow + (long)(i0 + r) * grad_out_ss + 4 * c4),
                         vload4(0, orow + (long)(i0 + r) * out_ss + 4 * c4));
            delta[row0 + r] = d;
        }
        rowv[r] = i0 + r < SQ ? lse[row0 + r] : INFINITY;   // rows past SQ: p = 0
        rowv[BM + r] = d;
    }
    if (!do_dq) return;
    const int hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, min(i0 + BM, SQ) - 1, L, SQ);
    __global const float *const kb = k + k_off + b * k_sb + hk * k_sh;
    __global const float *const vb = v + v_off + b * v_sb + hk * v_sh;
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const int rloc[2] = {warp * 16 + g, warp * 16 + g + 8};
    const int irow[2] = {min(i0 + rloc[0], SQ - 1), min(i0 + rloc[1], SQ - 1)};

    // q's and dO's fragments, raw (split a k step at a time: both split would hold 128 registers), through the
    // ring's memory
    uint qa[DK8][4], ga[DK8][4];
    load_rows_f(ring, q + q_off + b * q_sb + h * q_sh, q_ss, i0, BM, SQ, tid);
    load_rows_f(ring + 2 * BN * DPADF, grow, grad_out_ss, i0, BM, SQ, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    warp_fragments(qa, ring + warp * 16 * DPADF, lane);
    warp_fragments(ga, ring + (2 * BN + warp * 16) * DPADF, lane);
    float lse_r[2], delta_r[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        lse_r[r] = rowv[rloc[r]];
        delta_r[r] = rowv[BM + rloc[r]];
#if EXP_FUSED
        lse_r[r] = lse_r[r] == -INFINITY ? 0.0f : lse_r[r] * LOG2E;   // in log2 units
#endif
    }
    float dqa[DB][4];
    ZERO_ACC(dqa, DB);

    barrier(CLK_LOCAL_MEM_FENCE);   // q's and dO's rows are read: the ring's memory is free
    if (jend > 0) {
        issue_rows_f(ring, kb, k_ss, 0, BN, jend, tid);
        issue_rows_f(ring + 2 * BN * DPADF, vb, v_ss, 0, BN, jend, tid);
    }
    CP_COMMIT();
    for (int j0 = 0, it = 0; j0 < jend; j0 += BN, ++it) {
        __local float *const ks = ring + (it & 1) * BN * DPADF, *const vs = ks + 2 * BN * DPADF;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (j0 + BN < jend) {
            __local float *const kn = ring + ((it + 1) & 1) * BN * DPADF;
            issue_rows_f(kn, kb, k_ss, j0 + BN, BN, jend, tid);
            issue_rows_f(kn + 2 * BN * DPADF, vb, v_ss, j0 + BN, BN, jend, tid);
        }
        CP_COMMIT();
        CP_WAIT1();
        barrier(CLK_LOCAL_MEM_FENCE);

        float s[NB][4], dp[NB][4];
        ZERO_ACC(s, NB);
        ZERO_ACC(dp, NB);
#define K_ROWS(LN) B_ROWS(ks, LN)
#define V_ROWS(LN) B_ROWS(vs, LN)
        NT3(s, qa, NB, K_ROWS);
        NT3(dp, ga, NB, V_ROWS);
#undef K_ROWS
#undef V_ROWS
        // p = exp(s - lse) in place (0 where masked), dp times dropout's multipliers, ds = p (dp - delta)
#if EXP_FUSED
        float c = scale * LOG2E;
        if (!open_tile(j0, BN, i0, L, SQ, causal)) {
            SCALE_ACC(s, NB, scale);
            MASK_ROWS(s, irow);
            c = LOG2E;
        }
        #pragma unroll
        for (int jb = 0; jb < NB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[jb][e] = EXP2F(fma(s[jb][e], c, -lse_r[e >> 1]));
#else
        SCALE_ACC(s, NB, scale);
        if (!open_tile(j0, BN, i0, L, SQ, causal)) {
            MASK_ROWS(s, irow);
        }
        #pragma unroll
        for (int jb = 0; jb < NB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[jb][e] = s[jb][e] == -INFINITY ? 0.0f : EXPF(s[jb][e] - lse_r[e >> 1]);
#endif
        if (drop_threshold) DROP_ROWS(dp, s, rloc);
        #pragma unroll
        for (int jb = 0; jb < NB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) dp[jb][e] = s[jb][e] * (dp[jb][e] - delta_r[e >> 1]);
        KN3(dqa, dp, NB, ks);   // dq += ds k
    }
    #pragma unroll
    for (int r = 0; r < 2; ++r)
        if (i0 + rloc[r] < SQ) store_acc_row(GRAD_ROW(dq, b, h, i0 + rloc[r]), dqa, r, scale, t);
}
#endif

#if MMA_PASS == 3
// query tile `it` of the dk/dv pass's sequence (head gi = it / ntiles of the kv head's GROUP, rows istart +
// (it % ntiles) * BQ ..): its first row i0, head h, the rows' first index hrow0 in lse / delta
#define QTILE_AT(it)                                                                                    \
    const int gi_ = (it) / ntiles, i0 = istart + ((it) - gi_ * ntiles) * BQ, h = hk * GROUP + gi_;      \
    const long hrow0 = ((long)b * HQ + h) * SQ

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_backward_dkdv_tf32(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                  MASK_ARGS, LEN_ARGS, __global const float *lse, __global const float *delta,
                                  GRAD_ARGS(dk), GRAD_ARGS(dv), const int HQ, const int GROUP, const int SQ,
                                  const int SK, const int causal, const float scale, DROP_ARGS)
{
    __local float4 ring4[4 * BQ * DPADF / 4];   // q's two stages, then dO's
    __local float *const ring = (__local float *)ring4;
    __local float rowvb[2 * 2 * BQ];             // each stage's lse, then delta of its rows
    EMULATION_SCRATCH;
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int j0 = get_group_id(0) * KEYS, hk = get_global_id(1), b = get_global_id(2);
    if (j0 >= SK) return;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jloc[2] = {warp * 16 + g, warp * 16 + g + 8};

    // k's and v's fragments, raw (through the ring's memory)
    uint ka[DK8][4], va[DK8][4];
    load_rows_f(ring, k + k_off + b * k_sb + hk * k_sh, k_ss, j0, KEYS, SK, tid);
    load_rows_f(ring + 2 * BQ * DPADF, v + v_off + b * v_sb + hk * v_sh, v_ss, j0, KEYS, SK, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    warp_fragments(ka, ring + warp * 16 * DPADF, lane);
    warp_fragments(va, ring + (2 * BQ + warp * 16) * DPADF, lane);
    float dka[DB][4], dva[DB][4];
    ZERO_ACC(dka, DB);
    ZERO_ACC(dva, DB);

    // the query tiles of every head of the group as one sequence of GROUP * ntiles
    const int istart = query_start(causal, j0, L, SQ, BQ), ntiles = query_tiles(istart, j0, L, SQ, BQ);
    const int total = GROUP * ntiles;
    __global const float *const qhead = q + q_off + b * q_sb;
    __global const float *const ghead = grad_out + grad_out_off + b * grad_out_sb;
    // rows past SQ are zero-filled: q and dO rows of zeros add nothing to dk and dv whatever their p
#define ISSUE_QTILE(it, stage)                                                                          \
    do {                                                                                                \
        QTILE_AT(it);                                                                                   \
        __local float *const qn_ = ring + (stage) * BQ * DPADF;                                         \
        issue_rows_f(qn_, qhead + h * q_sh, q_ss, i0, BQ, SQ, tid);                                     \
        issue_rows_f(qn_ + 2 * BQ * DPADF, ghead + h * grad_out_sh, grad_out_ss, i0, BQ, SQ, tid);     \
        for (int r = tid; r < BQ; r += THREADS) {                                                       \
            const bool in = i0 + r < SQ;                                                                \
            nc_cp_async4(rowvb + (stage) * 2 * BQ + r, lse + (in ? hrow0 + i0 + r : 0), in ? 4 : 0);    \
            nc_cp_async4(rowvb + (stage) * 2 * BQ + BQ + r, delta + (in ? hrow0 + i0 + r : 0), in ? 4 : 0); \
        }                                                                                               \
    } while (0)
    barrier(CLK_LOCAL_MEM_FENCE);   // k's and v's rows are read: the ring's memory is free
    if (total > 0) ISSUE_QTILE(0, 0);
    CP_COMMIT();
    for (int it = 0; it < total; ++it) {
        QTILE_AT(it);
        const long mbase = mask_off + b * mask_sb + h * mask_sh;
        __local float *const qs = ring + (it & 1) * BQ * DPADF, *const gs = qs + 2 * BQ * DPADF;
        __local float *const rowv = rowvb + (it & 1) * 2 * BQ;
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp is done with tile it - 1: its stage is free
        if (it + 1 < total) ISSUE_QTILE(it + 1, (it + 1) & 1);
        CP_COMMIT();
        CP_WAIT1();
        barrier(CLK_LOCAL_MEM_FENCE);

        float st[QB][4], dpt[QB][4];
        ZERO_ACC(st, QB);
        ZERO_ACC(dpt, QB);
#define Q_ROWS(LN) B_ROWS(qs, LN)
#define G_ROWS(LN) B_ROWS(gs, LN)
        NT3(st, ka, QB, Q_ROWS);
        NT3(dpt, va, QB, G_ROWS);
#undef Q_ROWS
#undef G_ROWS
        // p^T = exp(s^T - lse) (0 where masked; columns past SQ meet zero rows of q and dO in the products);
        // ds^T = p^T (z dp^T - delta) in dpt's place and p^T z in st's (z: dropout's multiplier, 1 without)
        SCALE_ACC(st, QB, scale);
        if (!open_tile(j0, KEYS, i0, L, SQ, causal)) {
            MASK_COLS(st, QB);
        }
        #pragma unroll
        for (int jb = 0; jb < QB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float lse_c = rowv[jb * 8 + 2 * t + (e & 1)];
                st[jb][e] = st[jb][e] == -INFINITY ? 0.0f : EXPF(st[jb][e] - lse_c);
            }
        #pragma unroll
        for (int jb = 0; jb < QB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = jb * 8 + 2 * t + (e & 1);
                const float p = st[jb][e];
                float z = 1.0f;
                if (drop_threshold && p != 0.0f)
                    z = dropout_one(counter0, hrow0 + i0 + c, j0 + jloc[e >> 1], seed_lo, seed_hi, drop_threshold,
                                    drop_scale);
                dpt[jb][e] = p * (z * dpt[jb][e] - rowv[BQ + c]);
                st[jb][e] = p * z;
            }
        KN3(dva, st, QB, gs);    // dv += (p z)^T dO
        KN3(dka, dpt, QB, qs);   // dk += ds^T q
    }
#undef ISSUE_QTILE
    #pragma unroll
    for (int r = 0; r < 2; ++r)
        if (j0 + jloc[r] < SK) {
            store_acc_row(GRAD_ROW(dk, b, hk, j0 + jloc[r]), dka, r, scale, t);
            store_acc_row(GRAD_ROW(dv, b, hk, j0 + jloc[r]), dva, r, 1.0f, t);
        }
}
#endif
