// Streaming (flash) attention for GPUs: tiles of q, k, v in local memory, a GEMM-like register block per
// work-item, barriers between the steps of a tile. Masks, kv_len, causal alignment and dropout:
// attention_common.cl (the same rules, and the same dropout mask, as attention_cpu.cl).
//
// Work-items of a work-group form a TR x TC grid (local size TR * TC, 1-D); item (tr, tc) = (id / TC,
// id % TC) owns the rows tr + TR * a (a < RM = BM / TR) of a row tile, the columns tc + TC * b (b < CN =
// BN / TC) of a column tile, and the float4 groups tc + TC * e (e < CE) of the head dim, which local memory
// holds padded to DP = CE * 4 * TC >= D with zeros. Local rows are float4 arrays of DP / 4 + 1 (the +1
// keeps the TC columns of a phase in distinct banks).
//
// attention_forward_gpu: global (ceil(SQ / BM) * TR * TC, HQ, B). A work-group takes BM query rows of one
//   head (q times scale in local memory) and streams the valid keys in tiles of BN: k tile -> scores
//   (RM x CN per item) -> tile row max through local memory -> p = exp(s - m), the items' partial row sums
//   and outputs rescaled by exp(m_old - m_new) -> p (times the dropout multiplier) into local memory, v tile
//   over the k tile's memory -> out += p v. Writes out (B, HQ, SQ, D) at its strides (OUT_ARGS) and lse.
//   Local memory: (BM + BN) * (DP + 4) + BM * (BN + 4) + BM * TC values.
// attention_backward_dq_gpu: global (ceil(SQ / BM) * TR * TC, HQ, B). First delta = rowsum(dO * out) of the
//   tile's rows (written out: the dkdv pass reads it); then, when do_dq, per key tile: s = q k^T and
//   dp = dO v^T together, ds = p (z dp - delta) into local memory, dq += ds k. Local memory:
//   2 * (BM + BN) * (DP + 4) + BM * (BN + 4) + 2 * BM values.
// attention_backward_dkdv_gpu: global (ceil(SK / BN) * TR * TC, HKV, B); here the grid's rows are keys
//   (BN = TR * RM) and its columns queries (BM = TC * CN). A work-group keeps BN keys of one kv head (k, v
//   in local memory) and walks the query tiles of the GROUP heads that can see them: s^T and dp^T, then
//   p z and ds transposed into local memory, dv += (p z)^T dO and dk += ds^T (scale q). No atomics.
//   Local memory: 2 * (BN + BM) * (DP + 4) + 2 * BN * (BM + 4) + 2 * BM values.
//   With DQ_ATOMIC (FlashAttention-2's single backward pass; float32 only): the same kernel also adds
//   each query tile's dq share, scale * ds k (ds from local memory, k from the tile it already holds),
//   to the float32 buffer dq_acc (zeroed before; delta written before by attention_backward_dq_gpu with
//   do_dq = 0) with float atomic adds, item (tr, tc) taking query rows tr * QR .. tr * QR + QR - 1 (QR =
//   BM / TR) and the float4 groups tc + TC * e: 5 products per (query, key) pair where the two passes
//   take 7, no extra local memory. The work-groups of one head walk the query tiles in rotated orders
//   (work-group n starts at tile n) so that they add to different rows at a time. dq's rounding then
//   depends on the order of the adds (not reproducible bit for bit).
//   DQ_ATOMIC = ATOMIC_CAS (atomic_cmpxchg loop: OpenCL 1.2 has no float atomic add), ATOMIC_RED (NVIDIA:
//   inline PTX red.global.add.f32, a fire-and-forget add in L2) or ATOMIC_RED4 (red.global.add.v4.f32,
//   sm_90 and PTX ISA 8.1: one instruction per float4).
//   With DQ_SPLIT (the same single pass, reproducible bit for bit: FlashAttention-2's deterministic mode):
//   global (nsplit * TR * TC, HKV, B); work-group s takes the key tiles s, s + nsplit, s + 2 nsplit, ... in
//   turn (dk and dv stored after each) and adds dq's shares into its own float32 copy of dq, slice s of
//   dq_acc (nsplit, B, HQ, SQ, D), which it zeroes first (the GROUP heads of its kv head). No other
//   work-group touches that slice, and within the work-group the key tiles' adds are ordered by a barrier
//   with a global fence, so each element sums its shares in increasing key tile, whatever the schedule;
//   attention_dq_sum_gpu then sums the slices in the order s = 0 .. nsplit - 1. The adds into the own
//   slice: a plain load-add-store (DQ_ATOMIC = ATOMIC_NONE) or, on NVIDIA, the red instructions above
//   (ordered by the same barriers, no latency exposed). Query tiles are not rotated.
// attention_dq_sum_gpu: global ceil(n / 4), n = B * HQ * SQ * D: dq[e] = sum over s in increasing order
//   of dq_acc[s * n + e], four consecutive elements per work-item. Reads dq_acc; writes dq (float32).
//
// Build options: attention_common.cl's, and
//   BM, BN   query rows / keys of a tile (see each kernel)                       defaults 64, 32
//   TR, TC   the work-item grid (BM or BN a multiple of TR, the other of TC)     defaults 16, 8
//   CE       float4 groups of the head dim per work-item: DP = CE * 4 * TC >= D   default 2
//   VEC_ROWS rows start at multiples of 4 elements (float4 global loads; float32 only)
//   PASS     which kernels the program holds: PASS_ALL (default), PASS_FORWARD, PASS_DQ, PASS_DKDV (also the
//            fused pass), PASS_DECODE (with DR): each launch's program compiles only its own kernel
//   PREFETCH 1 (default): the forward's next k tile and the current v tile, and the fused backward's next q
//            and dO tiles, are loaded into registers while the work-group computes, stored to local memory
//            after; 0: each tile loaded right before its barrier (the global latency exposed)
//   ROW_SHFL 1: the forward's tile row maxima by warp shuffles (NVIDIA inline PTX shfl.sync; SHFL_EMULATE:
//            through local memory, for tests on any device) instead of partial maxima in local memory: no
//            barrier between the scores and p, and the v tile in its own local buffer, loaded with the k
//            tile (3 barriers a tile instead of 4). Local memory (BM + 2 * BN) * (DP + 4) + BM * (BN + 4).
//   NATIVE_EXP the probabilities' exp as native_exp (float32: NVIDIA's ex2.approx, ~2 ulp, 2 instructions
//            where exp takes ~10: the forward does one exp per 2 * D FMAs); forward, dq and dk/dv

#include "attention_common.cl"

#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 32
#endif
#ifndef TR
#define TR 16
#endif
#ifndef TC
#define TC 8
#endif
#ifndef CE
#define CE 2
#endif
#define PASS_ALL 0
#define PASS_FORWARD 1
#define PASS_DQ 2
#define PASS_DKDV 3
#define PASS_DECODE 4
#ifndef PASS
#define PASS PASS_ALL
#endif
#define ATOMIC_NONE 0
#define ATOMIC_CAS 1
#define ATOMIC_RED 2
#define ATOMIC_RED4 3
#ifndef DQ_ATOMIC
#define DQ_ATOMIC ATOMIC_NONE
#endif
#if defined(DQ_SPLIT) || DQ_ATOMIC != ATOMIC_NONE
#define DQ_SHARE 1            // the dk/dv kernel also adds dq's shares (the fused backward pass)
#else
#define DQ_SHARE 0
#endif
#if defined(NATIVE_EXP) && !defined(USE_FP64)
#define EXPF(x) native_exp(x)
#else
#define EXPF(x) exp(x)
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef ROW_SHFL
#define ROW_SHFL 0
#endif
#define NT (TR * TC)          // work-items per work-group
#define DP4 (CE * TC)         // float4 groups of the padded head dim
#define RS4 (DP4 + 1)         // float4s per local row of q / k / v / dO

#if defined(USE_FP64)
#define ACC4 double4
#else
#define ACC4 float4
#endif


inline ACC dot4(const ACC4 a, const ACC4 b)
{
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Four elements d .. d + 3 of a row as ACC (zeros past D).
inline ACC4 load4(__global const T *row, const int d)
{
#if defined(VEC_ROWS) && !defined(IS_HALF) && !defined(USE_FP64) && HEAD_DIM % 4 == 0
    return d < HEAD_DIM ? *(__global const float4 *)(row + d) : (ACC4)0;
#elif defined(IS_HALF) && HEAD_DIM % 4 == 0
    return d < HEAD_DIM ? vload_half4(0, row + d) : (ACC4)0;
#elif defined(IS_BF16) && HEAD_DIM % 4 == 0
    return d < HEAD_DIM ? as_float4(convert_uint4(vload4(0, row + d)) << 16) : (ACC4)0;
#else
    ACC4 x = (ACC4)0;
    if (d < HEAD_DIM) x.x = LDS(row, d);
    if (d + 1 < HEAD_DIM) x.y = LDS(row, d + 1);
    if (d + 2 < HEAD_DIM) x.z = LDS(row, d + 2);
    if (d + 3 < HEAD_DIM) x.w = LDS(row, d + 3);
    return x;
#endif
}

inline void store4(__global T *row, const int d, const ACC4 x)
{
#if defined(IS_HALF) && HEAD_DIM % 4 == 0
    if (d < HEAD_DIM) vstore_half4(x, 0, row + d);
#elif defined(IS_BF16) && HEAD_DIM % 4 == 0
    if (d < HEAD_DIM) vstore4((ushort4)(nc_float_to_bf16(x.x), nc_float_to_bf16(x.y), nc_float_to_bf16(x.z),
                                        nc_float_to_bf16(x.w)), 0, row + d);
#elif !defined(IS_HALF) && HEAD_DIM % 4 == 0
    if (d < HEAD_DIM) vstore4((ACC4)x, 0, row + d);
#else
    if (d < HEAD_DIM) STS(row, d, x.x);
    if (d + 1 < HEAD_DIM) STS(row, d + 1, x.y);
    if (d + 2 < HEAD_DIM) STS(row, d + 2, x.z);
    if (d + 3 < HEAD_DIM) STS(row, d + 3, x.w);
#endif
}

// Rows first .. first + count - 1 (of a row-strided operand at `base`) times `mul` into local rows of RS4
// float4s; rows at or past `limit` are zeros. All NT work-items take part.
inline void load_rows(__local ACC4 *dst, __global const T *base, const long row_stride, const int first,
                      const int count, const int limit, const ACC mul, const int tid)
{
    for (int slot = tid; slot < count * DP4; slot += NT) {
        const int r = slot / DP4, c4 = slot - r * DP4;
        ACC4 x = (ACC4)0;
        if (first + r < limit) x = load4(base + (first + r) * row_stride, 4 * c4) * mul;
        dst[r * RS4 + c4] = x;
    }
}

// Register staging of load_rows (PREFETCH): the global loads of a tile issued before the work that hides
// them, the local stores after it. KV_LR: float4s per work-item of a BN-row tile; Q_LR: of a BM-row tile.
#define KV_LR ((BN * DP4 + NT - 1) / NT)
#define Q_LR ((BM * DP4 + NT - 1) / NT)
#define fetch_rows(reg, base, row_stride, first, count, limit, tid)                                      \
    for (int n_ = 0; n_ < (sizeof(reg) / sizeof(ACC4)); ++n_) {                                        \
        const int slot_ = (tid) + n_ * NT, r_ = slot_ / DP4, c4_ = slot_ - r_ * DP4;                     \
        (reg)[n_] = slot_ < (count) * DP4 && (first) + r_ < (limit)                                       \
                    ? load4((base) + ((first) + r_) * (row_stride), 4 * c4_) : (ACC4)0;               \
    }
#define store_rows(dst, reg, count, mul, tid)                                                           \
    for (int n_ = 0; n_ < (sizeof(reg) / sizeof(ACC4)); ++n_) {                                        \
        const int slot_ = (tid) + n_ * NT, r_ = slot_ / DP4, c4_ = slot_ - r_ * DP4;                     \
        if (slot_ < (count) * DP4) (dst)[r_ * RS4 + c4_] = (reg)[n_] * (mul);                           \
    }

#if ROW_SHFL
#if defined(USE_FP64) || (TC & (TC - 1)) || TC > 32
#error "ROW_SHFL needs float accumulators and TC a power of two <= 32"
#endif
// The maximum of x over the TC work-items of a row (ids tr * TC .. tr * TC + TC - 1: lanes of one warp),
// by butterfly exchanges: NVIDIA's shfl.sync through inline PTX, or (SHFL_EMULATE, any device) through
// local memory with barriers (every item of the work-group must call it).
#ifdef SHFL_EMULATE
inline ACC row_max(ACC x, __local ACC *shx, const int tid)
{
    for (int m = TC / 2; m >= 1; m >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        shx[tid] = x;
        barrier(CLK_LOCAL_MEM_FENCE);
        x = fmax(x, shx[tid ^ m]);
    }
    return x;
}
#else
inline ACC row_max(ACC x)
{
    for (int m = TC / 2; m >= 1; m >>= 1) {
        uint y;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(y) : "r"(as_uint(x)), "r"(m));
        x = fmax(x, as_float(y));
    }
    return x;
}
#endif
#endif

#define RM_ (BM / TR)         // rows of the grid's items: query rows (forward, dq)
#define CN_ (BN / TC)         // columns: keys
#define PS4 (BN / 4 + 1)      // float4s per local row of p / ds

#if PASS == PASS_ALL || PASS == PASS_FORWARD
__kernel void attention_forward_gpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), MASK_ARGS, LEN_ARGS,
                                    OUT_ARGS, __global ACC *lse, const int HQ, const int GROUP,
                                    const int SQ, const int SK, const int causal, const ACC scale, DROP_ARGS)
{
    __local ACC4 qs[BM * RS4];
    __local ACC4 ps4[BM * PS4];            // p of the tile (times the dropout multiplier)
    __local ACC *ps = (__local ACC *)ps4;
#if ROW_SHFL
    __local ACC4 kvs[BN * RS4], vs[BN * RS4];   // the k and the v tile
    __local ACC *red = ps;                 // the final row sums (after the last tile)
#ifdef SHFL_EMULATE
    __local ACC shx[NT];
#endif
#else
    __local ACC4 kvs[BN * RS4];            // the k tile, then the v tile
    __local ACC4 red4[(BM * TC + 3) / 4];  // partial row maxima / sums (read as float4s where TC allows)
    __local ACC *red = (__local ACC *)red4;
#endif

    const int tid = get_local_id(0), tr = tid / TC, tc = tid - tr * TC;
    const int i0 = get_group_id(0) * BM, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const int hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, min(i0 + BM, SQ) - 1, L, SQ);
    const __global T *kb = k + k_off + b * k_sb + hk * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hk * v_sh;
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const long row0 = ((long)b * HQ + h) * SQ + i0;

    load_rows(qs, q + q_off + b * q_sb + h * q_sh, q_ss, i0, BM, SQ, scale, tid);

    ACC m[RM_], l[RM_];
    ACC4 o[RM_][CE];
    for (int a = 0; a < RM_; ++a) {
        m[a] = -INFINITY;
        l[a] = (ACC)0;
        for (int e = 0; e < CE; ++e) o[a][e] = (ACC4)0;
    }

#if PREFETCH
    ACC4 kreg[KV_LR], vreg[KV_LR];
    fetch_rows(kreg, kb, k_ss, 0, BN, jend, tid);
#if ROW_SHFL
    fetch_rows(vreg, vb, v_ss, 0, BN, jend, tid);
#endif
#endif
    for (int j0 = 0; j0 < jend; j0 += BN) {
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's p v is done with kvs and ps
#if ROW_SHFL && PREFETCH
        store_rows(kvs, kreg, BN, (ACC)1, tid);
        store_rows(vs, vreg, BN, (ACC)1, tid);
        if (j0 + BN < jend) {  // the next tile's loads in flight during this one
            fetch_rows(kreg, kb, k_ss, j0 + BN, BN, jend, tid);
            fetch_rows(vreg, vb, v_ss, j0 + BN, BN, jend, tid);
        }
#elif ROW_SHFL
        load_rows(kvs, kb, k_ss, j0, BN, jend, (ACC)1, tid);
        load_rows(vs, vb, v_ss, j0, BN, jend, (ACC)1, tid);
#elif PREFETCH
        store_rows(kvs, kreg, BN, (ACC)1, tid);
        fetch_rows(vreg, vb, v_ss, j0, BN, jend, tid);   // in flight during the scores
#else
        load_rows(kvs, kb, k_ss, j0, BN, jend, (ACC)1, tid);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);

        ACC s[RM_][CN_];
        for (int a = 0; a < RM_; ++a)
            for (int c = 0; c < CN_; ++c) s[a][c] = (ACC)0;
        for (int d4 = 0; d4 < DP4; ++d4) {
            ACC4 qa[RM_], kc[CN_];
            for (int a = 0; a < RM_; ++a) qa[a] = qs[(tr + TR * a) * RS4 + d4];
            for (int c = 0; c < CN_; ++c) kc[c] = kvs[(tc + TC * c) * RS4 + d4];
            for (int a = 0; a < RM_; ++a)
                for (int c = 0; c < CN_; ++c) s[a][c] += dot4(qa[a], kc[c]);
        }
#if ROW_SHFL
        ACC smax[RM_];
#endif
        // a tile every row of which may attend every key (no mask, all keys valid, below the causal edge)
        const bool open_tile = MASK == MASK_NONE && j0 + BN <= L && (!causal || j0 + BN - 1 <= i0 + L - SQ);
        for (int a = 0; a < RM_; ++a) {
            const int i = min(i0 + tr + TR * a, SQ - 1);
            ACC mx = -INFINITY;
            for (int c = 0; c < CN_; ++c) {
                const int j = j0 + tc + TC * c;
                if (!open_tile)
                    s[a][c] = masked_score(s[a][c], i, j, L, SQ, causal, mask, mbase + i * mask_si + j * mask_sj);
                mx = fmax(mx, s[a][c]);
            }
#if ROW_SHFL
            smax[a] = mx;
#else
            red[(tr + TR * a) * TC + tc] = mx;
#endif
        }
#if !ROW_SHFL
        barrier(CLK_LOCAL_MEM_FENCE);
#endif

        for (int a = 0; a < RM_; ++a) {
            const int r = tr + TR * a;
            ACC mx = m[a];
#if ROW_SHFL
#ifdef SHFL_EMULATE
            mx = fmax(mx, row_max(smax[a], shx, tid));
#else
            mx = fmax(mx, row_max(smax[a]));
#endif
#elif TC % 4 == 0
            for (int t4 = 0; t4 < TC / 4; ++t4) {
                const ACC4 x = red4[r * (TC / 4) + t4];
                mx = fmax(mx, fmax(fmax(x.x, x.y), fmax(x.z, x.w)));
            }
#else
            for (int t = 0; t < TC; ++t) mx = fmax(mx, red[r * TC + t]);
#endif
            // alpha: 1 while nothing is allowed yet (mx = -inf), else exp(m_old - m_new)
            const ACC alpha = mx == -INFINITY ? (ACC)1 : EXPF(m[a] - mx);
            ACC sum = (ACC)0;
            for (int c = 0; c < CN_; ++c) {
                const int j = j0 + tc + TC * c;
                ACC p = s[a][c] == -INFINITY ? (ACC)0 : EXPF(s[a][c] - mx);
                sum += p;
                if (drop_threshold && p != (ACC)0)
                    p *= dropout_one(counter0, row0 + r, j, seed_lo, seed_hi, drop_threshold, drop_scale);
                ps[r * 4 * PS4 + tc + TC * c] = p;
            }
            m[a] = mx;
            l[a] = l[a] * alpha + sum;
            for (int e = 0; e < CE; ++e) o[a][e] *= alpha;
        }
#if ROW_SHFL
        // (v is in vs already)
#elif PREFETCH
        store_rows(kvs, vreg, BN, (ACC)1, tid);  // every item is past its reads of the k tile
        if (j0 + BN < jend) fetch_rows(kreg, kb, k_ss, j0 + BN, BN, jend, tid);  // in flight during p v
#else
        load_rows(kvs, vb, v_ss, j0, BN, jend, (ACC)1, tid);  // every item is past its reads of the k tile
#endif
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int kk = 0; kk < BN; kk += 4) {
            ACC4 pa[RM_];
            for (int a = 0; a < RM_; ++a) pa[a] = ps4[(tr + TR * a) * PS4 + kk / 4];
            for (int t = 0; t < 4; ++t) {
                ACC4 vv[CE];
#if ROW_SHFL
                for (int e = 0; e < CE; ++e) vv[e] = vs[(kk + t) * RS4 + tc + TC * e];
#else
                for (int e = 0; e < CE; ++e) vv[e] = kvs[(kk + t) * RS4 + tc + TC * e];
#endif
                for (int a = 0; a < RM_; ++a) {
                    const ACC p = t == 0 ? pa[a].x : t == 1 ? pa[a].y : t == 2 ? pa[a].z : pa[a].w;
                    for (int e = 0; e < CE; ++e) o[a][e] += p * vv[e];
                }
            }
        }
    }

    // the row sums are spread over the TC items of a row
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int a = 0; a < RM_; ++a) red[(tr + TR * a) * TC + tc] = l[a];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int a = 0; a < RM_; ++a) {
        const int r = tr + TR * a;
        if (i0 + r >= SQ) continue;
        ACC total = (ACC)0;
        for (int t = 0; t < TC; ++t) total += red[r * TC + t];
        const ACC inv = total > (ACC)0 ? (ACC)1 / total : (ACC)0;
        __global T *orow = OUT_ROW(b, h, i0 + r);
        for (int e = 0; e < CE; ++e) store4(orow, 4 * (tc + TC * e), o[a][e] * inv);
        if (tc == 0) lse[row0 + r] = total > (ACC)0 ? m[a] + log(total) : -INFINITY;
    }
}
#endif  // PASS_FORWARD

#if PASS == PASS_ALL || PASS == PASS_DQ
__kernel void attention_backward_dq_gpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                        MASK_ARGS, LEN_ARGS, __global const ACC *lse, __global ACC *delta,
                                        GRAD_ARGS(dq), const int do_dq, const int HQ, const int GROUP,
                                        const int SQ, const int SK, const int causal, const ACC scale, DROP_ARGS)
{
    __local ACC4 qs[BM * RS4], gs[BM * RS4], ks[BN * RS4], vs[BN * RS4];
    __local ACC4 ds4[BM * PS4];
    __local ACC *dss = (__local ACC *)ds4;
    __local ACC lse_s[BM], delta_s[BM];

    const int tid = get_local_id(0), tr = tid / TC, tc = tid - tr * TC;
    const int i0 = get_group_id(0) * BM, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const int hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, min(i0 + BM, SQ) - 1, L, SQ);
    const __global T *kb = k + k_off + b * k_sb + hk * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hk * v_sh;
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const long row0 = ((long)b * HQ + h) * SQ + i0;

    load_rows(qs, q + q_off + b * q_sb + h * q_sh, q_ss, i0, BM, SQ, scale, tid);
    load_rows(gs, grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh, grad_out_ss, i0, BM, SQ, (ACC)1, tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    // delta of the tile's rows: dO (local) . out (global), one row per item
    for (int r = tid; r < BM; r += NT) {
        ACC d = (ACC)0, l_r = -INFINITY;
        if (i0 + r < SQ) {
            const __global T *orow = out + out_off + b * out_sb + h * out_sh + (i0 + r) * out_ss;
            for (int d4 = 0; d4 < DP4; ++d4) d += dot4(gs[r * RS4 + d4], load4(orow, 4 * d4));
            delta[row0 + r] = d;
            l_r = lse[row0 + r];
        }
        delta_s[r] = d;
        lse_s[r] = l_r;
    }
    if (!do_dq) return;

    ACC4 dqa[RM_][CE];
    for (int a = 0; a < RM_; ++a)
        for (int e = 0; e < CE; ++e) dqa[a][e] = (ACC4)0;

    for (int j0 = 0; j0 < jend; j0 += BN) {
        barrier(CLK_LOCAL_MEM_FENCE);  // delta_s / lse_s written; the previous tile's ds k is done
        load_rows(ks, kb, k_ss, j0, BN, jend, (ACC)1, tid);
        load_rows(vs, vb, v_ss, j0, BN, jend, (ACC)1, tid);
        barrier(CLK_LOCAL_MEM_FENCE);

        ACC s[RM_][CN_], dp[RM_][CN_];
        for (int a = 0; a < RM_; ++a)
            for (int c = 0; c < CN_; ++c) s[a][c] = dp[a][c] = (ACC)0;
        for (int d4 = 0; d4 < DP4; ++d4) {
            ACC4 qa[RM_], ga[RM_], kc[CN_], vc[CN_];
            for (int a = 0; a < RM_; ++a) {
                qa[a] = qs[(tr + TR * a) * RS4 + d4];
                ga[a] = gs[(tr + TR * a) * RS4 + d4];
            }
            for (int c = 0; c < CN_; ++c) {
                kc[c] = ks[(tc + TC * c) * RS4 + d4];
                vc[c] = vs[(tc + TC * c) * RS4 + d4];
            }
            for (int a = 0; a < RM_; ++a)
                for (int c = 0; c < CN_; ++c) {
                    s[a][c] += dot4(qa[a], kc[c]);
                    dp[a][c] += dot4(ga[a], vc[c]);
                }
        }
        for (int a = 0; a < RM_; ++a) {
            const int r = tr + TR * a;
            const int i = min(i0 + r, SQ - 1);
            const ACC lse_r = lse_s[r], delta_r = delta_s[r];
            for (int c = 0; c < CN_; ++c) {
                const int j = j0 + tc + TC * c;
                const ACC sc = masked_score(s[a][c], i, j, L, SQ, causal, mask, mbase + i * mask_si + j * mask_sj);
                ACC d = (ACC)0;
                if (sc != -INFINITY && lse_r != -INFINITY) {
                    const ACC p = EXPF(sc - lse_r);
                    ACC z = (ACC)1;
                    if (drop_threshold)
                        z = dropout_one(counter0, row0 + r, j, seed_lo, seed_hi, drop_threshold, drop_scale);
                    d = p * (z * dp[a][c] - delta_r);
                }
                dss[r * 4 * PS4 + tc + TC * c] = d;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int kk = 0; kk < BN; kk += 4) {
            ACC4 da[RM_];
            for (int a = 0; a < RM_; ++a) da[a] = ds4[(tr + TR * a) * PS4 + kk / 4];
            for (int t = 0; t < 4; ++t) {
                ACC4 kv[CE];
                for (int e = 0; e < CE; ++e) kv[e] = ks[(kk + t) * RS4 + tc + TC * e];
                for (int a = 0; a < RM_; ++a) {
                    const ACC d = t == 0 ? da[a].x : t == 1 ? da[a].y : t == 2 ? da[a].z : da[a].w;
                    for (int e = 0; e < CE; ++e) dqa[a][e] += d * kv[e];
                }
            }
        }
    }

    for (int a = 0; a < RM_; ++a) {
        const int r = tr + TR * a;
        if (i0 + r >= SQ) continue;
        __global T *drow = GRAD_ROW(dq, b, h, i0 + r);
        for (int e = 0; e < CE; ++e) store4(drow, 4 * (tc + TC * e), dqa[a][e] * scale);
    }
}
#endif  // PASS_DQ

#undef RM_
#undef CN_
#undef PS4

#if DQ_SHARE
// x added to p[0 .. n - 1] (n <= 4 elements of a float4; zeros are not added)
inline void add4_atomic(__global float *p, const float4 x, const int n)
{
#if DQ_ATOMIC == ATOMIC_RED4
    if (n == 4) {
        if (x.x != 0.0f || x.y != 0.0f || x.z != 0.0f || x.w != 0.0f)
            asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                         :: "l"((ulong)p), "f"(x.x), "f"(x.y), "f"(x.z), "f"(x.w) : "memory");
        return;
    }
#elif DQ_ATOMIC == ATOMIC_NONE
    // (DQ_SPLIT: p lies in this work-group's own slice, and this work-item is the only one adding to it now)
    if (n == 4) {
        vstore4(vload4(0, p) + x, 0, p);
        return;
    }
#endif
    const float v[4] = {x.x, x.y, x.z, x.w};
    for (int t = 0; t < n; ++t) {
        if (v[t] == 0.0f) continue;
#if DQ_ATOMIC == ATOMIC_NONE
        p[t] += v[t];
#elif DQ_ATOMIC == ATOMIC_CAS
        // the first guess of the old value is 0 (dq_acc starts at 0): no plain read racing the atomics
        volatile __global uint *u = (volatile __global uint *)(p + t);
        uint seen = 0u, old;
        while ((old = atomic_cmpxchg(u, seen, as_uint(as_float(seen) + v[t]))) != seen) seen = old;
#else
        asm volatile("red.global.add.f32 [%0], %1;" :: "l"((ulong)(p + t)), "f"(v[t]) : "memory");
#endif
    }
}
#define DQ_ARG , __global float *dq_acc
#else
#define DQ_ARG
#endif

// dkdv: the grid's rows are keys, its columns queries
#define RK_ (BN / TR)         // keys per item
#define CQ_ (BM / TC)         // query rows per item
#define PT4 (BM / 4 + 1)      // float4s per local row of (p z)^T / ds^T
#define QR_ (BM / TR)         // query rows per item in the dq share (DQ_ATOMIC, DQ_SPLIT)
#if DQ_SHARE && (BM % TR)
#error "DQ_ATOMIC and DQ_SPLIT need BM a multiple of TR"
#endif

#if PASS == PASS_ALL || PASS == PASS_DKDV
__kernel void attention_backward_dkdv_gpu(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out),
                                          MASK_ARGS, LEN_ARGS, __global const ACC *lse, __global const ACC *delta,
                                          GRAD_ARGS(dk), GRAD_ARGS(dv) DQ_ARG, const int HQ,
                                          const int GROUP, const int SQ, const int SK, const int causal,
                                          const ACC scale, DROP_ARGS)
{
    __local ACC4 ks[BN * RS4], vs[BN * RS4], qs[BM * RS4], gs[BM * RS4];
    __local ACC4 pt4[BN * PT4], dt4[BN * PT4];
    __local ACC *pt = (__local ACC *)pt4, *dt = (__local ACC *)dt4;
    __local ACC lse_s[BM], delta_s[BM];

    const int tid = get_local_id(0), tr = tid / TC, tc = tid - tr * TC;
    const int hk = get_global_id(1), b = get_global_id(2);
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);

#ifdef DQ_SPLIT
    // this work-group's own copy of dq: slice s of dq_acc, zeroed here for the GROUP heads of kv head hk
    const int nsplit = get_num_groups(0);
    dq_acc += (long)get_group_id(0) * get_global_size(2) * HQ * SQ * HEAD_DIM;
    {
        __global float *mine = dq_acc + ((long)b * HQ + hk * GROUP) * SQ * HEAD_DIM;
        const long count = (long)GROUP * SQ * HEAD_DIM;
        for (long e = tid; e < count; e += NT) mine[e] = 0.0f;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int j0 = get_group_id(0) * BN; j0 < SK; j0 += nsplit * BN) {
#else
    {
        const int j0 = get_group_id(0) * BN;
        if (j0 >= SK) return;
#endif
        ACC4 dka[RK_][CE], dva[RK_][CE];
        for (int a = 0; a < RK_; ++a)
            for (int e = 0; e < CE; ++e) dka[a][e] = dva[a][e] = (ACC4)0;

        if (j0 < L) {
            load_rows(ks, k + k_off + b * k_sb + hk * k_sh, k_ss, j0, BN, L, (ACC)1, tid);
            load_rows(vs, v + v_off + b * v_sb + hk * v_sh, v_ss, j0, BN, L, (ACC)1, tid);
            // causal: row i sees key j0 only if i >= j0 - (L - SQ); start at the tile holding that row
            const int i_first = causal ? max(0, j0 - (L - SQ)) : 0;
            for (int g = 0; g < GROUP; ++g) {
                const int h = hk * GROUP + g;
                const long rowh = ((long)b * HQ + h) * SQ;
                const long mbase = mask_off + b * mask_sb + h * mask_sh;
                const __global T *qb = q + q_off + b * q_sb + h * q_sh;
                const __global T *gb = grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh;
                const int ntiles = (SQ - i_first + BM - 1) / BM;
#if DQ_ATOMIC != ATOMIC_NONE && !defined(DQ_SPLIT)
                const int rot = get_group_id(0) % max(ntiles, 1);
#else
                const int rot = 0;
#endif
#if PREFETCH
                ACC4 qreg[Q_LR], greg[Q_LR];
                if (ntiles > 0) {
                    const int i0n = i_first + (rot % ntiles) * BM;
                    fetch_rows(qreg, qb, q_ss, i0n, BM, SQ, tid);
                    fetch_rows(greg, gb, grad_out_ss, i0n, BM, SQ, tid);
                }
#endif
                for (int n = 0; n < ntiles; ++n) {
                    const int i0 = i_first + ((n + rot) % ntiles) * BM;
                    barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's updates are done with qs, gs, pt, dt
#if PREFETCH
                    store_rows(qs, qreg, BM, scale, tid);
                    store_rows(gs, greg, BM, (ACC)1, tid);
                    if (n + 1 < ntiles) {  // the next tile's loads in flight during this one's products
                        const int i0n = i_first + ((n + 1 + rot) % ntiles) * BM;
                        fetch_rows(qreg, qb, q_ss, i0n, BM, SQ, tid);
                        fetch_rows(greg, gb, grad_out_ss, i0n, BM, SQ, tid);
                    }
#else
                    load_rows(qs, qb, q_ss, i0, BM, SQ, scale, tid);
                    load_rows(gs, gb, grad_out_ss, i0, BM, SQ, (ACC)1, tid);
#endif
                    for (int r = tid; r < BM; r += NT) {
                        lse_s[r] = i0 + r < SQ ? lse[rowh + i0 + r] : -INFINITY;
                        delta_s[r] = i0 + r < SQ ? delta[rowh + i0 + r] : (ACC)0;
                    }
                    barrier(CLK_LOCAL_MEM_FENCE);

                    ACC s[RK_][CQ_], dp[RK_][CQ_];
                    for (int a = 0; a < RK_; ++a)
                        for (int c = 0; c < CQ_; ++c) s[a][c] = dp[a][c] = (ACC)0;
                    for (int d4 = 0; d4 < DP4; ++d4) {
                        ACC4 ka[RK_], va[RK_], qc[CQ_], gc[CQ_];
                        for (int a = 0; a < RK_; ++a) {
                            ka[a] = ks[(tr + TR * a) * RS4 + d4];
                            va[a] = vs[(tr + TR * a) * RS4 + d4];
                        }
                        for (int c = 0; c < CQ_; ++c) {
                            qc[c] = qs[(tc + TC * c) * RS4 + d4];
                            gc[c] = gs[(tc + TC * c) * RS4 + d4];
                        }
                        for (int a = 0; a < RK_; ++a)
                            for (int c = 0; c < CQ_; ++c) {
                                s[a][c] += dot4(ka[a], qc[c]);
                                dp[a][c] += dot4(va[a], gc[c]);
                            }
                    }
                    // every query row of the tile may attend every key of this one (no per-score checks)
                    const bool open_tile = MASK == MASK_NONE && j0 + BN <= L &&
                                           (!causal || j0 + BN - 1 <= i0 + L - SQ);
                    for (int a = 0; a < RK_; ++a) {
                        const int kr = tr + TR * a, j = j0 + kr;
                        for (int c = 0; c < CQ_; ++c) {
                            const int qr = tc + TC * c, i = min(i0 + qr, SQ - 1);
                            const ACC sc = open_tile ? s[a][c] : masked_score(s[a][c], i, j, L, SQ, causal, mask,
                                                                              mbase + i * mask_si + j * mask_sj);
                            ACC pz = (ACC)0, d = (ACC)0;
                            if (sc != -INFINITY && lse_s[qr] != -INFINITY) {
                                const ACC p = EXPF(sc - lse_s[qr]);
                                ACC z = (ACC)1;
                                if (drop_threshold)
                                    z = dropout_one(counter0, rowh + i, j, seed_lo, seed_hi, drop_threshold, drop_scale);
                                pz = p * z;
                                d = p * (z * dp[a][c] - delta_s[qr]);
                            }
                            pt[kr * 4 * PT4 + qr] = pz;
                            dt[kr * 4 * PT4 + qr] = d;
                        }
                    }
                    barrier(CLK_LOCAL_MEM_FENCE);

                    for (int qq = 0; qq < BM; qq += 4) {
                        ACC4 pa[RK_], da[RK_];
                        for (int a = 0; a < RK_; ++a) {
                            pa[a] = pt4[(tr + TR * a) * PT4 + qq / 4];
                            da[a] = dt4[(tr + TR * a) * PT4 + qq / 4];
                        }
                        for (int t = 0; t < 4; ++t) {
                            ACC4 gv[CE], qv[CE];
                            for (int e = 0; e < CE; ++e) {
                                gv[e] = gs[(qq + t) * RS4 + tc + TC * e];
                                qv[e] = qs[(qq + t) * RS4 + tc + TC * e];
                            }
                            for (int a = 0; a < RK_; ++a) {
                                const ACC pz = t == 0 ? pa[a].x : t == 1 ? pa[a].y : t == 2 ? pa[a].z : pa[a].w;
                                const ACC d = t == 0 ? da[a].x : t == 1 ? da[a].y : t == 2 ? da[a].z : da[a].w;
                                for (int e = 0; e < CE; ++e) {
                                    dva[a][e] += pz * gv[e];
                                    dka[a][e] += d * qv[e];
                                }
                            }
                        }
                    }
#if DQ_SHARE
                    // this key tile's share of dq: rows tr * QR + a of the query tile, float4 groups tc + TC * e
                    ACC4 dqp[QR_][CE];
                    for (int a = 0; a < QR_; ++a)
                        for (int e = 0; e < CE; ++e) dqp[a][e] = (ACC4)0;
                    for (int kk = 0; kk < BN; ++kk) {
                        ACC4 kv[CE];
                        for (int e = 0; e < CE; ++e) kv[e] = ks[kk * RS4 + tc + TC * e];
#if QR_ % 4 == 0
                        for (int a4 = 0; a4 < QR_ / 4; ++a4) {
                            const ACC4 d = dt4[kk * PT4 + tr * (QR_ / 4) + a4];
                            for (int e = 0; e < CE; ++e) {
                                dqp[4 * a4][e] += d.x * kv[e];
                                dqp[4 * a4 + 1][e] += d.y * kv[e];
                                dqp[4 * a4 + 2][e] += d.z * kv[e];
                                dqp[4 * a4 + 3][e] += d.w * kv[e];
                            }
                        }
#else
                        for (int a = 0; a < QR_; ++a) {
                            const ACC d = dt[kk * 4 * PT4 + tr * QR_ + a];
                            for (int e = 0; e < CE; ++e) dqp[a][e] += d * kv[e];
                        }
#endif
                    }
                    for (int a = 0; a < QR_; ++a) {
                        const int i = i0 + tr * QR_ + a;
                        if (i >= SQ) break;
                        __global float *drow = dq_acc + (rowh + i) * HEAD_DIM;
                        for (int e = 0; e < CE; ++e) {
                            const int d = 4 * (tc + TC * e);
                            if (d < HEAD_DIM) add4_atomic(drow + d, dqp[a][e] * scale, min(4, HEAD_DIM - d));
                        }
                    }
#endif
                }
            }
        }

        for (int a = 0; a < RK_; ++a) {
            const int kr = tr + TR * a;
            if (j0 + kr >= SK) continue;
            for (int e = 0; e < CE; ++e) {
                store4(GRAD_ROW(dk, b, hk, j0 + kr), 4 * (tc + TC * e), dka[a][e]);
                store4(GRAD_ROW(dv, b, hk, j0 + kr), 4 * (tc + TC * e), dva[a][e]);
            }
        }
#ifdef DQ_SPLIT
        // the next key tile overwrites ks and vs, and its dq adds must land after this tile's
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
#endif
    }
}

#ifdef DQ_SPLIT
__kernel void attention_dq_sum_gpu(__global const float *dq_acc, __global float *dq, const long n,
                                   const int nsplit)
{
    const long e0 = get_global_id(0) * 4;
    if (e0 >= n) return;
    if (e0 + 4 <= n) {
        float4 acc = vload4(0, dq_acc + e0);
        for (int s = 1; s < nsplit; ++s) acc += vload4(0, dq_acc + s * n + e0);
        vstore4(acc, 0, dq + e0);
        return;
    }
    for (long e = e0; e < n; ++e) {
        float acc = dq_acc[e];
        for (int s = 1; s < nsplit; ++s) acc += dq_acc[s * n + e];
        dq[e] = acc;
    }
}
#endif
#endif  // PASS_DKDV

#if defined(DR) && (PASS == PASS_ALL || PASS == PASS_DECODE)
// -- decoding: few query rows against many keys -----------------------------------------------------------
// attention_decode_gpu: global (NSPLIT * DNT, HKV, B), local DNT. A work-group takes the DR = GROUP * SQ query
//   rows that read kv head hk (row r: head hk * GROUP + r / SQ, query i = r % SQ), so a kv tile is read once
//   for the whole group of heads, and the keys of split s, [s * chunk, min(s * chunk + chunk, L')) with L'
//   the keys the last row may attend: tiles of DK keys (k tile in local memory -> DR x DK scores -> row
//   maxima, p, row sums -> the v tile over the k tile -> o += p v, the items as KG groups of DR * DQ4 (row,
//   float4) pairs, a group taking every KG-th key of the tile). With one split holding keys it writes out and
//   lse; else the split's output (unnormalised, at its own running max), running max and sum go to part_o
//   (rows, nsplit, 4 * DQ4) and part_ml (rows, nsplit, 2) (PART_STORE), and the last split of the (kv head,
//   batch) to finish (nc_group_last_arrival on arrivals[b * HKV + hk]) merges the parts of its rows in the
//   order s = 0..nsplit-1 (the splits that held keys), whichever finished last:
//   out = sum_s o_s exp(m_s - M) / sum_s l_s exp(m_s - M), lse = M + log(...), M = max_s m_s. One launch, no combine kernel. Float accumulators only when split
//   (the parts move through PART_STORE / PART_LOAD of common.cl: 32-bit atomics, or plain accesses fenced
//   on NVIDIA; netcl.ops.attention keeps float64 in one split).
//   Local memory: (DR + DK) * DRS4 * 4 + 2 * DR * DK + 4 * DR + 4 * KG * DPAIRS values.
//   With ROPE_CACHE (netcl.ops.rope_cache_decode_attention: the rotary embedding and the cache write of the new
//   rows in this launch, instead of rope_qkv_cache before it): q is the stacked q/k/v projection's heads
//   (B, HQ + 2 HKV, SQ, D) through its strides, un-rotated; k and v are the caches (B, HKV, SK = capacity, D),
//   written here; kv_len's arguments are replaced by position (position[position_off + b * position_stride]:
//   the keys cached before these SQ rows), so the valid keys are L = position + SQ and row i sits at position
//   p = position + i. q's rows are rotated at p while staged (rope_common.cl's arithmetic, rounded to T as
//   rope_qkv_cache stores them, then times scale). The split whose keys [s * chunk, s * chunk + chunk) hold
//   new positions rotates those rows' k (head HQ + hk of q) into k and copies their v (head HQ + HKV + hk) into
//   v as its key tiles take them (decode_rows: the tiles hold the rounded values a read back would give, and
//   no other work-group reads those positions: other splits hold other keys, other (b, hk) other cache
//   rows), so the bits are those of rope_qkv_cache and then this kernel. A position outside [0, SK - SQ] is reported to err (err_code); that
//   batch row then has no valid keys and writes nothing (output 0, lse -inf). (An early return there crashed
//   PoCL 3.1's float64 build.)
//   cos_table, sin_table: (>= SK, D / 2) of ACC. PAIRING: ROPE_HALF or ROPE_INTERLEAVED (rope_common.cl).
//   With DECODE_PRELOAD (P keys, a multiple of DK; not float64): a split's cached keys and values (at most P:
//   the host's chunk) are read into local memory at once by decode_begin, as T's bits (the same values load4
//   gives): one round trip for the split's keys, before a chain's wait, instead of one a key tile after it;
//   the split is then done in one pass (below: every score at once, no running maximum). Splits past the
//   last that holds keys (live, from the valid keys) return at once; where one split holds them all it
//   writes out and lse itself (the merge of one part: the same bits), and the merge counts the live splits
//   only.
//   With HEAD_SPLIT (Q > 1, with DECODE_PRELOAD only): the GROUP q heads of a kv head over Q work-groups, each
//   a "virtual kv head" hk of HKV * Q (the host's grid and GROUP are the virtual ones: GROUP / Q heads, DR
//   rows): its keys and values are those of kv head hk / Q, each of the Q preloads them, and the new rows go
//   into the caches from the first of the Q only (hk % Q == 0; the others hold the same rounded values in
//   local memory). The caches get the bits of one work-group a kv head; out and lse its values to rounding
//   (fewer rows a work-group: a row's butterflies and p v's key groups span more items).
// Build options: DR (rows of a work-group: GROUP * SQ), DK (keys per tile, default 64), DNT (items, default 128),
//   MERGE_BATCH (the splits whose parts the merge loads at once, default 4), DECODE_PRELOAD,
//   ROPE_CACHE (flag) with PAIRING.
#ifndef DK
#define DK 64
#endif
#ifndef DNT
#define DNT 128
#endif
#define DQ4 ((HEAD_DIM + 3) / 4)                          // float4 groups of a row
#define DRS4 (DQ4 + 1)                                    // float4s per local row
#define DPAIRS (DR * DQ4)                                 // (row, float4) pairs of the output
#define KG (DNT / DPAIRS > 1 ? DNT / DPAIRS : 1)          // item groups over a tile's keys
#define DSLOTS (KG * DPAIRS)
#define NPT ((DSLOTS + DNT - 1) / DNT)                    // output slots per item
#ifndef MERGE_BATCH
#define MERGE_BATCH 4                                     // splits' parts a merge loads at once
#endif
#ifdef DECODE_PRELOAD
#if defined(USE_FP64)
#error "attention_gpu.cl: DECODE_PRELOAD holds 16- or 32-bit rows"
#endif
#if DECODE_PRELOAD % DK
#error "attention_gpu.cl: DECODE_PRELOAD must be a multiple of DK"
#endif
#if defined(IS_HALF) || defined(IS_BF16)
#define PRE_T ushort                                      // a preloaded element: T's bits
#define PRE_BYTES 2
#else
#define PRE_T float
#define PRE_BYTES 4
#endif
// elements a preloaded row: 4 * DQ4 (zeros past HEAD_DIM), then 4 of padding, so that the lanes of a warp
// reading the same column of consecutive rows (the scores) fall on different banks
#define PRE_ROW (4 * DQ4 + 4)
#if KG > 1 && DSLOTS * 16 <= DECODE_PRELOAD * PRE_ROW * PRE_BYTES
#define ORED_IN_PRE                                       // the groups' partial outputs in pk's room (unread by then)
#endif
#define PRE_BATCH 4                                       // loads an item issues before it stores them

#if defined(IS_HALF) || defined(IS_BF16)
#define PRE_T4 ushort4
#else
#define PRE_T4 float4
#endif

// Elements d .. d + 3 of a row of the cache as PRE_T (zeros past D); pre_load4: four of them in local memory
// as ACC (load4's values exactly).
inline PRE_T4 pre_get4(const __global T *row, const int d)
{
#if defined(IS_HALF) || defined(IS_BF16)
    const __global ushort *r = (const __global ushort *)row;
#else
    const __global float *r = row;
#endif
#if HEAD_DIM % 4 == 0
    return vload4(0, r + d);
#else
    PRE_T4 x = (PRE_T4)0;
    if (d < HEAD_DIM) x.x = r[d];
    if (d + 1 < HEAD_DIM) x.y = r[d + 1];
    if (d + 2 < HEAD_DIM) x.z = r[d + 2];
    if (d + 3 < HEAD_DIM) x.w = r[d + 3];
    return x;
#endif
}

inline ACC4 pre_load4(__local const PRE_T *p)
{
#if defined(IS_HALF)
    return vload_half4(0, (__local const half *)p);
#elif defined(IS_BF16)
    return as_float4(convert_uint4(vload4(0, p)) << 16);
#else
    return vload4(0, p);
#endif
}

// Four values already rounded to T, as T's bits (exact).
inline void pre_store4(__local PRE_T *p, const ACC4 x)
{
#if defined(IS_HALF)
    vstore_half4(x, 0, (__local half *)p);
#elif defined(IS_BF16)
    vstore4((ushort4)(nc_float_to_bf16(x.x), nc_float_to_bf16(x.y), nc_float_to_bf16(x.z), nc_float_to_bf16(x.w)),
            0, p);
#else
    vstore4(x, 0, p);
#endif
}

// The whole split in one pass (its keys all in local memory): every (row, key) score at once, each row's
// maximum and sum over WIDE_G items (a butterfly: NVIDIA's warp shuffles, elsewhere through local memory in
// the same order), then p v. WIDE_G: the largest power of two <= 32 that DNT / DR holds and DNT a multiple of.
#define WIDE_G_(n) (DNT / DR >= (n) && DNT % (n) == 0)
#define WIDE_G (WIDE_G_(32) ? 32 : WIDE_G_(16) ? 16 : WIDE_G_(8) ? 8 : WIDE_G_(4) ? 4 : WIDE_G_(2) ? 2 : 1)
// The value of item flat ^ m (m < WIDE_G: an item of the same group): a warp shuffle on NVIDIA, elsewhere
// through local memory (every work-item of the work-group calls it; those at flat >= DNT only reach the
// barriers)
inline ACC wide_xor(const ACC x, const int m, __local ACC *red, const int flat)
{
#if defined(NC_NVIDIA)
    uint y;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(y) : "r"(as_uint(x)), "r"(m));
    return as_float(y);
#else
    barrier(CLK_LOCAL_MEM_FENCE);
    if (flat < DNT) red[flat] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    return flat < DNT ? red[flat ^ m] : x;
#endif
}

inline ACC wide_max(ACC x, __local ACC *red, const int flat)
{
    for (int m = WIDE_G / 2; m >= 1; m >>= 1) x = fmax(x, wide_xor(x, m, red, flat));
    return x;
}

inline ACC wide_sum(ACC x, __local ACC *red, const int flat)
{
    for (int m = WIDE_G / 2; m >= 1; m >>= 1) x += wide_xor(x, m, red, flat);
    return x;
}
#endif

#ifdef ROPE_CACHE
#include "checks.cl"
#include "rope_common.cl"
#define ROPE_HALF_DIM (HEAD_DIM / 2)
#if defined(IS_HALF)
#define ROUND_T(x) nc_h2f(nc_f2h(x))
#elif defined(IS_BF16)
#define ROUND_T(x) nc_bf16_to_float(nc_float_to_bf16(x))
#else
#define ROUND_T(x) (x)
#endif
// the caches are written; kv_len's four arguments become position's three; the tables and the check record
#define DECODE_KV_ARGS(n) __global T *n, const long n##_off, const long n##_sb, const long n##_sh, const long n##_ss
#define DECODE_LEN_ARGS __global const int *position, const long position_off, const int position_stride
#define DECODE_ROPE_ARGS , __global const ACC *cos_table, __global const ACC *sin_table, __global int *err, \
                         const int err_code

// Element e of row x rotated at the position whose table rows are cosr and sinr, rounded to T (what
// rope_qkv_cache stores and the un-fused kernel loads).
inline ACC rope_element(__global const T *x, const int e, __global const ACC *cosr, __global const ACC *sinr)
{
#if PAIRING == ROPE_HALF
    const int i = e < ROPE_HALF_DIM ? e : e - ROPE_HALF_DIM, i1 = i, i2 = i + ROPE_HALF_DIM;
    const int second = e >= ROPE_HALF_DIM;
#else
    const int i = e >> 1, i1 = 2 * i, i2 = 2 * i + 1;
    const int second = e & 1;
#endif
    const ACC x1 = LDS(x, i1), x2 = LDS(x, i2), c = cosr[i], sn = sinr[i];
    return ROUND_T(second ? rope_second(x1, x2, c, sn) : rope_first(x1, x2, c, sn));
}

inline ACC4 rope_load4(__global const T *x, const int d, __global const ACC *cosr, __global const ACC *sinr)
{
    ACC4 r = (ACC4)0;
    if (d < HEAD_DIM) r.x = rope_element(x, d, cosr, sinr);
    if (d + 1 < HEAD_DIM) r.y = rope_element(x, d + 1, cosr, sinr);
    if (d + 2 < HEAD_DIM) r.z = rope_element(x, d + 2, cosr, sinr);
    if (d + 3 < HEAD_DIM) r.w = rope_element(x, d + 3, cosr, sinr);
    return r;
}
#else
#define DECODE_KV_ARGS(n) KV_ARGS(n)
#define DECODE_LEN_ARGS LEN_ARGS
#define DECODE_ROPE_ARGS
#endif

#ifndef HEAD_SPLIT
#define HEAD_SPLIT 1
#endif
#if HEAD_SPLIT > 1 && !defined(DECODE_PRELOAD)
#error "attention_gpu.cl: HEAD_SPLIT takes the preloaded split (DECODE_PRELOAD)"
#endif

// The decode local memory of one work-group (a struct, so a chain kernel can hold it beside its own).
typedef struct {
    ACC4 qs[DR * DRS4];
#ifdef DECODE_PRELOAD
    PRE_T pk[DECODE_PRELOAD * PRE_ROW], pv[DECODE_PRELOAD * PRE_ROW];   // the split's keys, values
    ACC sw[DR * DECODE_PRELOAD];   // its scores, then p times the dropout multiplier
    ACC red[DNT];                  // the rows' butterflies (elsewhere than on NVIDIA's shuffles)
    ACC m_s[DR], l_s[DR];
#else
    ACC4 kvs[DK * DRS4];        // the k tile (then the v tile, without DECODE_VS)
#ifdef DECODE_VS
    ACC4 vs[DK * DRS4];         // the v tile
#endif
    ACC ss[DR * DK];            // scores, then p times the dropout multiplier
    ACC pl[DR * DK];            // p (the row sums' terms)
    ACC m_s[DR], mnew_s[DR], alpha_s[DR], l_s[DR];
#endif
#ifdef ORED_IN_PRE
    ACC4 ored[1];
#else
    ACC4 ored[KG > 1 ? DSLOTS : 1];
#endif
    int last;
} decode_local;

// The keys of one decode tile: L valid ones, the new rows from p0 (ROPE_CACHE: this step's, [p0, L); else
// p0 = L), this split's [jstart, jstop), and jend those the last query row may attend.
typedef struct {
    int L, p0, jend, jstart, jstop;
} decode_span;

// Rows [j0, j0 + DK) of a key tile of k (is_v 0) or v (is_v 1) into dst (local, rows of DRS4): with `cached`,
// the rows below p0 from the cache (row j at cache + j * cache_ss) and zeros from jstop; with `fresh`, the
// new rows [p0, jstop) from the q/k/v heads (row p0 + i at src + i * src_ss: ROPE_CACHE), k rotated at its
// position and rounded to T, and written into the cache for the steps after this one (its bits: the values
// rounded to T already), so the tile holds what the cache's row gives back, without that round trip.
inline void decode_rows(__local ACC4 *dst, const __global T *cache, const long cache_ss, const int j0,
                        const int jstop, const int p0, const int cached, const int fresh,
                        const __global T *src, const long src_ss, const int is_v,
                        __global const ACC *cosines, __global const ACC *sines, __global T *write, const int tid)
{
    for (int slot = tid; slot < DK * DQ4; slot += DNT) {
        const int jj = slot / DQ4, c4 = slot - jj * DQ4, j = j0 + jj;
        if (j >= jstop || j < p0) {
            if (cached) dst[jj * DRS4 + c4] = j < jstop ? load4(cache + j * cache_ss, 4 * c4) : (ACC4)0;
        }
#ifdef ROPE_CACHE
        else if (fresh) {
            const __global T *x = src + (j - p0) * src_ss;
            const long at = (long)j * ROPE_HALF_DIM;
            const ACC4 row = is_v ? load4(x, 4 * c4) : rope_load4(x, 4 * c4, cosines + at, sines + at);
            dst[jj * DRS4 + c4] = row;
            store4(write + j * cache_ss, 4 * c4, row);
        }
#endif
    }
}

// The part of a decode tile that reads nothing the phases of its chain write (gemm_gemv.cl's gemv_layers
// runs it before it waits for the q/k/v product): the span of its keys (the position, which is checked, or
// kv_len) and the cached rows of its first key tile (k into kvs, and v into vs with DECODE_VS).
inline decode_span decode_begin(const int tid, const int split, const int hk, const int b,
                                __local decode_local *lm, DECODE_KV_ARGS(k), DECODE_KV_ARGS(v), DECODE_LEN_ARGS,
                                const int chunk, const int SQ, const int SK, const int causal DECODE_ROPE_ARGS)
{
    decode_span sp;
#ifdef ROPE_CACHE
    const int asked = position[position_off + b * position_stride];
    const int bad = asked < 0 || asked > SK - SQ;   // reported; then no keys, no writes, output 0 (lse -inf)
    if (bad && tid == 0 && split == 0 && hk == 0)
        report_check(err, err_code, asked < 0 ? asked : asked + SQ - 1, b, SK);
    sp.p0 = bad ? 0 : asked;
    sp.L = bad ? 0 : sp.p0 + SQ;
    __global const ACC *cosines = cos_table, *sines = sin_table;
#else
    sp.L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    sp.p0 = sp.L;
    __global const ACC *cosines = 0, *sines = 0;
#endif
    sp.jend = key_end(causal, SQ - 1, sp.L, SQ);
    sp.jstart = split * chunk;
    sp.jstop = min(sp.jstart + chunk, sp.jend);
#ifdef DECODE_PRELOAD
    // every cached row of the split (those below p0), k and v, PRE_BATCH loads an item in flight at once
    const int hkr = hk / HEAD_SPLIT;   // the kv head of the caches (HEAD_SPLIT: hk is a virtual one)
    const __global T *kr = k + k_off + b * k_sb + hkr * k_sh, *vr = v + v_off + b * v_sb + hkr * v_sh;
    const int slots = max(min(sp.jstop, sp.p0) - sp.jstart, 0) * DQ4;
    for (int s0 = 0; s0 < slots; s0 += PRE_BATCH * DNT) {
        PRE_T4 kx[PRE_BATCH], vx[PRE_BATCH];
#pragma unroll
        for (int u = 0; u < PRE_BATCH; ++u) {
            const int slot = min(s0 + u * DNT + tid, slots - 1), jj = slot / DQ4, c4 = slot - jj * DQ4;
            kx[u] = pre_get4(kr + (sp.jstart + jj) * k_ss, 4 * c4);
            vx[u] = pre_get4(vr + (sp.jstart + jj) * v_ss, 4 * c4);
        }
#pragma unroll
        for (int u = 0; u < PRE_BATCH; ++u) {
            const int slot = s0 + u * DNT + tid, jj = slot / DQ4, c4 = slot - jj * DQ4;
            if (slot < slots) {
                vstore4(kx[u], 0, lm->pk + jj * PRE_ROW + 4 * c4);
                vstore4(vx[u], 0, lm->pv + jj * PRE_ROW + 4 * c4);
            }
        }
    }
#else
    decode_rows(lm->kvs, k + k_off + b * k_sb + hk * k_sh, k_ss, sp.jstart, sp.jstop, sp.p0, 1, 0, k, 0, 0,
                cosines, sines, 0, tid);
#ifdef DECODE_VS
    decode_rows(lm->vs, v + v_off + b * v_sb + hk * v_sh, v_ss, sp.jstart, sp.jstop, sp.p0, 1, 0, v, 0, 1,
                cosines, sines, 0, tid);
#endif
#endif
    return sp;
}

// The decode arguments after the operands' (attention_decode_gpu's, and gemm_gemv.cl's gemv_chain's with
// CHAIN_ATTN, which passes its own arrival counts)
#define DECODE_TAIL_ARGS __global T *out, __global ACC *lse, __global ACC *part_o, __global ACC *part_ml, \
    const int nsplit, const int chunk, const int HQ, const int GROUP, const int SQ, const int SK, const int causal, \
    const ACC scale, DROP_ARGS DECODE_ROPE_ARGS
#ifdef ROPE_CACHE
#define DECODE_LEN_PASS position, position_off, position_stride
#define DECODE_ROPE_PASS , cos_table, sin_table, err, err_code
#else
#define DECODE_LEN_PASS kv_len, kv_len_off, has_kv_len, kv_len_stride
#define DECODE_ROPE_PASS
#endif
#define DECODE_PASS(tid, split, hk, b, hkv, arrivals, lm)                                                   \
    decode_tile(tid, split, hk, b, hkv, arrivals, lm,                                                      \
                decode_begin(tid, split, hk, b, lm, k, k_off, k_sb, k_sh, k_ss, v, v_off, v_sb, v_sh, v_ss,      \
                             DECODE_LEN_PASS, chunk, SQ, SK, causal DECODE_ROPE_PASS),                          \
                q, q_off, q_sb, q_sh, q_ss, k, k_off, k_sb, k_sh, k_ss, v, v_off, v_sb, v_sh, v_ss, mask, mask_off, \
                mask_sb, mask_sh, mask_si, mask_sj, out, lse, part_o, part_ml, nsplit, chunk, HQ, GROUP, SQ, SK,  \
                causal, scale, drop_threshold, drop_scale, seed_lo, seed_hi, counter0 DECODE_ROPE_PASS)

// One work-group's share of the decode attention: the rows of kv head hk of batch row b against split
// `split` of the keys (hkv kv heads; arrivals: the (b, hk) arrival counts of the splits' merge). tid: the
// work-item, 0 .. DNT - 1; a work-group of more items gives the others a tid past every slot count (2^28):
// they take no slot and only reach the barriers (every work-item calls this). sp: decode_begin's, which
// loaded the first key tile's cached rows into lm (DECODE_PRELOAD: the split's).
inline void decode_tile(const int tid, const int split, const int hk, const int b, const int hkv,
                        __global int *arrivals, __local decode_local *lm, const decode_span sp, KV_ARGS(q),
                        DECODE_KV_ARGS(k), DECODE_KV_ARGS(v), MASK_ARGS, DECODE_TAIL_ARGS)
{
#ifdef ORED_IN_PRE
    __local ACC4 *qs = lm->qs, *ored = (__local ACC4 *)lm->pk;
#else
    __local ACC4 *qs = lm->qs, *ored = lm->ored;
#endif
    __local ACC *m_s = lm->m_s, *l_s = lm->l_s;
#ifndef DECODE_PRELOAD
    __local ACC4 *kvs = lm->kvs;
    __local ACC *ss = lm->ss, *pl = lm->pl, *mnew_s = lm->mnew_s, *alpha_s = lm->alpha_s;
#ifdef DECODE_VS
    __local ACC4 *vt = lm->vs;
#else
    __local ACC4 *vt = kvs;
#endif
#endif
    const int L = sp.L, p0 = sp.p0, jend = sp.jend, jstart = sp.jstart, jstop = sp.jstop;
    // the splits that hold keys (at least one: split 0 writes a row with none); the others have nothing to do
    const int live = max(1, min(nsplit, (jend + chunk - 1) / chunk));
    if (split >= live) return;
    const int hkr = hk / HEAD_SPLIT;   // the kv head of the caches and of the new rows (HEAD_SPLIT: virtual hk)
    const __global T *kb = k + k_off + b * k_sb + hkr * k_sh;
    const __global T *vb = v + v_off + b * v_sb + hkr * v_sh;

    for (int slot = tid; slot < DR * DQ4; slot += DNT) {
        const int r = slot / DQ4, c4 = slot - r * DQ4;
        const int h = hk * GROUP + r / SQ, i = r % SQ;
#ifdef ROPE_CACHE
        const long at = (long)(p0 + i) * ROPE_HALF_DIM;
        qs[r * DRS4 + c4] = rope_load4(q + q_off + b * q_sb + h * q_sh + i * q_ss, 4 * c4, cos_table + at,
                                       sin_table + at) * scale;
#else
        qs[r * DRS4 + c4] = load4(q + q_off + b * q_sb + h * q_sh + i * q_ss, 4 * c4) * scale;
#endif
    }
#ifdef DECODE_PRELOAD
    // the new rows among this split's keys (ROPE_CACHE): k rotated at its position and rounded to T, v as it
    // is, into the caches for the steps after this one and into the split's rows here. Their slots go to the
    // items past q's first (a rotation of the items): where DNT > DR * DQ4 those read them while the others
    // read q (one memory round trip after a chain's wait, not two for the items that took both)
    const int flat = get_local_id(1) * get_local_size(0) + get_local_id(0);
    const int nk = max(jstop - jstart, 0);
#ifdef ROPE_CACHE
    {
        const __global T *ky = q + q_off + b * q_sb + (HQ + hkr) * q_sh, *vy = ky + (hkv / HEAD_SPLIT) * q_sh;
        __global T *kw = k + k_off + b * k_sb + hkr * k_sh, *vw = v + v_off + b * v_sb + hkr * v_sh;
        const int writes = hk % HEAD_SPLIT == 0;   // (one of a kv head's HEAD_SPLIT work-groups)
        const int f0 = max(p0, jstart);
        const int first = tid < DNT ? (tid + DNT - (DR * DQ4) % DNT) % DNT : tid;
        for (int slot = first; slot < max(jstop - f0, 0) * DQ4; slot += DNT) {
            const int jf = slot / DQ4, c4 = slot - jf * DQ4, j = f0 + jf;
            const long at = (long)j * ROPE_HALF_DIM;
            const ACC4 kr = rope_load4(ky + (j - p0) * q_ss, 4 * c4, cos_table + at, sin_table + at);
            const ACC4 vr = load4(vy + (j - p0) * q_ss, 4 * c4);
            if (writes) {
                store4(kw + j * k_ss, 4 * c4, kr);
                store4(vw + j * v_ss, 4 * c4, vr);
            }
            pre_store4(lm->pk + (j - jstart) * PRE_ROW + 4 * c4, kr);
            pre_store4(lm->pv + (j - jstart) * PRE_ROW + 4 * c4, vr);
        }
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);   // q, the split's rows (decode_begin's and the new ones)
    __local ACC *sw = lm->sw;
    for (int slot = tid; slot < DR * nk; slot += DNT) {
        const int r = slot / nk, jj = slot - r * nk, j = jstart + jj;
        const int h = hk * GROUP + r / SQ, i = r % SQ;
        ACC s = (ACC)0;
        for (int c4 = 0; c4 < DQ4; ++c4) s += dot4(qs[r * DRS4 + c4], pre_load4(lm->pk + jj * PRE_ROW + 4 * c4));
        sw[r * DECODE_PRELOAD + jj] = masked_score(s, i, j, L, SQ, causal, mask,
                                                   mask_off + b * mask_sb + h * mask_sh + i * mask_si + j * mask_sj);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    {   // row r's maximum and sum over the WIDE_G items of group r (every item takes part in the butterflies)
        __local ACC *red = lm->red;
        const int r = flat / WIDE_G, lane = flat - r * WIDE_G, mine = r < DR && tid < DNT;
        __local ACC *row = sw + (mine ? r : 0) * DECODE_PRELOAD;
        ACC mx = -INFINITY;
        if (mine)
            for (int jj = lane; jj < nk; jj += WIDE_G) mx = fmax(mx, row[jj]);
        mx = wide_max(mx, red, flat);
        ACC sum = (ACC)0;
        if (mine) {
            const int h = hk * GROUP + r / SQ, i = r % SQ;
            for (int jj = lane; jj < nk; jj += WIDE_G) {
                const ACC s = row[jj];
                ACC p = s == -INFINITY ? (ACC)0 : exp(s - mx);
                sum += p;
                if (drop_threshold && p != (ACC)0)
                    p *= dropout_one(counter0, ((long)b * HQ + h) * SQ + i, jstart + jj, seed_lo, seed_hi,
                                     drop_threshold, drop_scale);
                row[jj] = p;
            }
        }
        sum = wide_sum(sum, red, flat);
        if (mine && lane == 0) {
            m_s[r] = mx;
            l_s[r] = sum;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ACC4 o[NPT];
    for (int n = 0; n < NPT; ++n) {
        const int slot = tid + n * DNT;
        o[n] = (ACC4)0;
        if (slot >= DSLOTS) break;
        const int g = slot / DPAIRS, pair = slot - g * DPAIRS, r = pair / DQ4, c4 = pair - r * DQ4;
        ACC4 acc = (ACC4)0;
        for (int jj = g; jj < nk; jj += KG)
            acc += sw[r * DECODE_PRELOAD + jj] * pre_load4(lm->pv + jj * PRE_ROW + 4 * c4);
        o[n] = acc;
    }
#else
#ifdef ROPE_CACHE
    // the new rows among this split's keys: their k and v heads, which the key tiles (decode_rows) rotate,
    // hold and write into the caches
    const __global T *ky = q + q_off + b * q_sb + (HQ + hk) * q_sh;
    const __global T *vy = ky + hkv * q_sh;
    __global const ACC *cosines = cos_table, *sines = sin_table;
    __global T *kw = k + k_off + b * k_sb + hk * k_sh, *vw = v + v_off + b * v_sb + hk * v_sh;
    // the first key tile's new rows (its cached ones are decode_begin's) are read with q, before the first
    // barrier: the items that take them are mostly not those staging q, so both loads fly at once (one round
    // trip after a chain's wait, not two)
    decode_rows(kvs, kb, k_ss, jstart, jstop, p0, 0, 1, ky, q_ss, 0, cosines, sines, kw, tid);
#ifdef DECODE_VS
    decode_rows(vt, vb, v_ss, jstart, jstop, p0, 0, 1, vy, q_ss, 1, cosines, sines, vw, tid);
#endif
#else
    const __global T *ky = kb, *vy = vb;   // (no new rows: p0 = L, the first tile's rows are in place)
    __global const ACC *cosines = 0, *sines = 0;
    __global T *kw = 0, *vw = 0;
#endif
    for (int r = tid; r < DR; r += DNT) {
        m_s[r] = -INFINITY;
        l_s[r] = (ACC)0;
        alpha_s[r] = (ACC)1;
    }
    ACC4 o[NPT];
    for (int n = 0; n < NPT; ++n) o[n] = (ACC4)0;

    for (int j0 = jstart; j0 < jstop; j0 += DK) {
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's p v is done with kvs, vs, ss and alpha_s
        if (j0 != jstart) {   // (the first tile's rows are in place)
            decode_rows(kvs, kb, k_ss, j0, jstop, p0, 1, 1, ky, q_ss, 0, cosines, sines, kw, tid);
#ifdef DECODE_VS
            decode_rows(vt, vb, v_ss, j0, jstop, p0, 1, 1, vy, q_ss, 1, cosines, sines, vw, tid);
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int slot = tid; slot < DR * DK; slot += DNT) {
            const int r = slot / DK, jj = slot - r * DK, j = j0 + jj;
            const int h = hk * GROUP + r / SQ, i = r % SQ;
            ACC s = (ACC)0;
            for (int c4 = 0; c4 < DQ4; ++c4) s += dot4(qs[r * DRS4 + c4], kvs[jj * DRS4 + c4]);
            ss[slot] = j >= jstop ? -INFINITY
                     : masked_score(s, i, j, L, SQ, causal, mask,
                                    mask_off + b * mask_sb + h * mask_sh + i * mask_si + j * mask_sj);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = tid; r < DR; r += DNT) {
            ACC mx = m_s[r];
            for (int jj = 0; jj < DK; ++jj) mx = fmax(mx, ss[r * DK + jj]);
            mnew_s[r] = mx;
            alpha_s[r] = mx == -INFINITY ? (ACC)1 : exp(m_s[r] - mx);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int slot = tid; slot < DR * DK; slot += DNT) {
            const int r = slot / DK, jj = slot - r * DK, j = j0 + jj;
            const ACC s = ss[slot];
            ACC p = s == -INFINITY ? (ACC)0 : exp(s - mnew_s[r]);
            pl[slot] = p;
            if (drop_threshold && p != (ACC)0) {
                const int h = hk * GROUP + r / SQ, i = r % SQ;
                p *= dropout_one(counter0, ((long)b * HQ + h) * SQ + i, j, seed_lo, seed_hi, drop_threshold,
                                 drop_scale);
            }
            ss[slot] = p;
        }
#ifndef DECODE_VS  // every item is past its reads of the k tile: the v tile takes its place
        decode_rows(kvs, vb, v_ss, j0, jstop, p0, 1, 1, vy, q_ss, 1, cosines, sines, vw, tid);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = tid; r < DR; r += DNT) {
            ACC sum = (ACC)0;
            for (int jj = 0; jj < DK; ++jj) sum += pl[r * DK + jj];
            l_s[r] = l_s[r] * alpha_s[r] + sum;
            m_s[r] = mnew_s[r];
        }
        for (int n = 0; n < NPT; ++n) {
            const int slot = tid + n * DNT;
            if (slot >= DSLOTS) break;
            const int g = slot / DPAIRS, pair = slot - g * DPAIRS, r = pair / DQ4, c4 = pair - r * DQ4;
            ACC4 acc = o[n] * alpha_s[r];
            for (int jj = g; jj < DK; jj += KG) acc += ss[r * DK + jj] * vt[jj * DRS4 + c4];
            o[n] = acc;
        }
    }

#endif

    // the KG groups' partial outputs, then each (row, float4) pair written once
    barrier(CLK_LOCAL_MEM_FENCE);
#if KG > 1
    for (int n = 0; n < NPT; ++n)
        if (tid + n * DNT < DSLOTS) ored[tid + n * DNT] = o[n];
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    for (int n = 0; n < NPT; ++n) {
        const int slot = tid + n * DNT;
        if (slot >= DPAIRS) break;
        const int r = slot / DQ4, c4 = slot - r * DQ4;
        ACC4 acc = o[n];
#if KG > 1
        for (int g = 1; g < KG; ++g) acc += ored[g * DPAIRS + slot];
#endif
        const int h = hk * GROUP + r / SQ, i = r % SQ;
        const long row = ((long)b * HQ + h) * SQ + i;
        const ACC l = l_s[r];
        if (live == 1) {   // (the merge of this one part would give the same bits)
            store4(out + row * HEAD_DIM, 4 * c4, acc * (l > (ACC)0 ? (ACC)1 / l : (ACC)0));
            if (c4 == 0) lse[row] = l > (ACC)0 ? m_s[r] + log(l) : -INFINITY;
        } else {
#ifndef USE_FP64
            const long prow = row * nsplit + split;
            __global ACC *po = part_o + prow * 4 * DQ4 + 4 * c4;
            PART_STORE(po, 0, acc.x);
            PART_STORE(po, 1, acc.y);
            PART_STORE(po, 2, acc.z);
            PART_STORE(po, 3, acc.w);
            if (c4 == 0) {
                PART_STORE(part_ml, 2 * prow, m_s[r]);
                PART_STORE(part_ml, 2 * prow + 1, l);
            }
#endif
        }
    }
#ifndef USE_FP64
    if (live == 1) return;

    // the last of the live splits of this (kv head, batch) to get here merges their parts (a recorded decode
    // step keeps the cache's capacity of splits while the valid keys grow; those past the valid keys left
    // above)
    if (!nc_group_last_arrival(arrivals + (long)b * hkv + hk, live, &lm->last)) return;
    for (int slot = tid; slot < DPAIRS; slot += DNT) {
        const int r = slot / DQ4, c4 = slot - r * DQ4;
        const int h = hk * GROUP + r / SQ, i = r % SQ;
        const long row = ((long)b * HQ + h) * SQ + i;
        const __global ACC *ml = part_ml + 2 * row * nsplit;
        const __global ACC *po = part_o + row * nsplit * 4 * DQ4 + 4 * c4;
        // the parts are loaded MERGE_BATCH splits at a time, every load of a batch issued before any is read
        // (a load under a branch on the one before it waits a round trip each: 4 a split); the first batch,
        // part values too, once for both passes (one round trip where live <= MERGE_BATCH)
        ACC mb[MERGE_BATCH], lb[MERGE_BATCH];
        ACC4 ob[MERGE_BATCH];
#pragma unroll
        for (int u = 0; u < MERGE_BATCH; ++u) {
            const int s = min(u, live - 1);
            mb[u] = PART_LOAD(ml, 2 * s);
            lb[u] = PART_LOAD(ml, 2 * s + 1);
            const __global ACC *ps = po + s * 4 * DQ4;
            ob[u] = (ACC4)(PART_LOAD(ps, 0), PART_LOAD(ps, 1), PART_LOAD(ps, 2), PART_LOAD(ps, 3));
        }
        ACC M = -INFINITY;
#pragma unroll
        for (int u = 0; u < MERGE_BATCH; ++u)
            if (u < live && lb[u] > (ACC)0) M = fmax(M, mb[u]);
        for (int s0 = MERGE_BATCH; s0 < live; s0 += MERGE_BATCH) {
            ACC mr[MERGE_BATCH], lr[MERGE_BATCH];
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                const int s = min(s0 + u, live - 1);
                mr[u] = PART_LOAD(ml, 2 * s);
                lr[u] = PART_LOAD(ml, 2 * s + 1);
            }
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u)
                if (s0 + u < live && lr[u] > (ACC)0) M = fmax(M, mr[u]);
        }
        ACC total = (ACC)0;
        ACC4 acc = (ACC4)0;
        for (int s0 = 0; s0 < live; s0 += MERGE_BATCH) {
            if (s0 > 0) {
#pragma unroll
                for (int u = 0; u < MERGE_BATCH; ++u) {
                    const int s = min(s0 + u, live - 1);
                    mb[u] = PART_LOAD(ml, 2 * s);
                    lb[u] = PART_LOAD(ml, 2 * s + 1);
                    const __global ACC *ps = po + s * 4 * DQ4;
                    ob[u] = (ACC4)(PART_LOAD(ps, 0), PART_LOAD(ps, 1), PART_LOAD(ps, 2), PART_LOAD(ps, 3));
                }
            }
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                if (s0 + u >= live || !(lb[u] > (ACC)0)) continue;
                const ACC w = exp(mb[u] - M);
                total += lb[u] * w;
                acc += w * ob[u];
            }
        }
        store4(out + row * HEAD_DIM, 4 * c4, acc * (total > (ACC)0 ? (ACC)1 / total : (ACC)0));
        if (c4 == 0) lse[row] = total > (ACC)0 ? M + log(total) : -INFINITY;
    }
#endif
}


__kernel void attention_decode_gpu(KV_ARGS(q), DECODE_KV_ARGS(k), DECODE_KV_ARGS(v), MASK_ARGS, DECODE_LEN_ARGS,
                                   __global int *arrivals, DECODE_TAIL_ARGS)
{
    __local decode_local lm;
    DECODE_PASS(get_local_id(0), get_group_id(0), get_global_id(1), get_global_id(2), get_global_size(1),
                arrivals, &lm);
}

#endif
