// Streaming (flash) attention forward for float16 / bfloat16 inputs on NVIDIA's matrix units: q k^T and
// p v through mma.sync m16n8k16 (mma_sync.cl), the online softmax in float32 registers (FlashAttention-2's
// scheme). The rules (masks, kv_len, causal alignment, dropout) are attention_common.cl's, so results and
// lse match attention_gpu.cl's within half's rounding of p.
//
// attention_forward_mma: global (ceil(SQ / BM) * THREADS, HQ, B), local THREADS = BM / (16 RB) warps. Warp w
//   owns query rows i0 + 16 RB w .. + 16 RB - 1 of the work-group's BM (RB blocks of 16); its q fragments (A
//   operands, 16 x HEAD_DIM a block) stay in registers. Key tiles of BN: k and v rows into local memory (16-byte loads, rows past the last
//   key a row may see are zeros), then per warp s = q k^T (16 x BN accumulators; lane: rows g and g + 8,
//   columns 2t, 2t + 1 of each 8-key block), scale and mask, row maxima over the four lanes of a row (warp
//   shuffles), p = exp(s - m) in float32, rescaled running sums and outputs, p rounded to the input's dtype
//   as the A operand of p v (the accumulator layout of two 8-key blocks is the A fragment of one k step),
//   v's fragments by ldmatrix.trans. Out = o / l stored in T, lse = m + log(l) (-inf and 0 for a row that
//   may see no key). Local memory: 2 * BN * (HEAD_DIM + 8) 16-bit values (the q tile passes through the k
//   tile's memory first).
//
// MMA_PASS: the one kernel a program holds (1 forward, 2 dq, 3 dk/dv: each pass is built with its own tiles, and
// PoCL builds the emulated kernels slowly), 0 all three.
#ifndef MMA_PASS
#define MMA_PASS 0
#endif

// Build options: attention_common.cl's (T is float16 or bfloat16 storage), HEAD_DIM (a multiple of 16, at
// most 128), BM (query rows, a multiple of 16 RB), BN (keys of a tile, a multiple of 16), RB (1 or 2),
// NATIVE_EXP, MMA_EMULATE (mma, ldmatrix and the shuffles emulated through local memory: tests on any
// device). Rows of q, k, v start on 16-byte boundaries (the host checks).

#include "attention_common.cl"

#if defined(IS_BF16)
#define MMA_BF16
#else
#define MMA_F16
#endif
#define KSTEP 16
#include "mma_sync.cl"
#include "attention_frag.cl"

#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
// RB: 16-row blocks of queries a warp of the forward and dq passes (FlashAttention-2 gives a warp 32 rows:
// each k or v fragment read from local memory by ldmatrix then feeds RB mma, where one block gave it one;
// local memory's bandwidth, not the units, bounded the passes at one block: 4 clocks an ldmatrix.x4 against
// ~1.5 a mma an SM). The dk/dv pass keeps 16 keys a warp (RB 1).
#ifndef RB
#define RB 1
#endif
#define WROWS (16 * RB)          // query rows a warp
#define WARPS (BM / WROWS)
#define THREADS (WARPS * 32)
#define KEYS (WARPS * 16)        // keys of a dk/dv work-group: 16 a warp
#define DPAD (HEAD_DIM + 8)      // local row length (16-bit values): a 16-byte pad keeps ldmatrix's 8 rows
                                 // on 8 different bank groups
#define NB (BN / 8)              // 8-key blocks of the scores
#define DB (HEAD_DIM / 8)        // 8-column blocks of the output
#define DK (HEAD_DIM / 16)       // k steps of q k^T
#define CH (HEAD_DIM / 8)        // 16-byte chunks of a row
#if (HEAD_DIM % 16) || HEAD_DIM > 128 || (BN % 16) || (BM % WROWS) || RB < 1 || RB > 2
#error "attention_mma.cl: HEAD_DIM a multiple of 16 up to 128, BN a multiple of 16, BM of 16 RB (RB 1 or 2)"
#endif
// DSPLIT (the dk/dv pass): dk's and dv's head-dim columns in DSPLIT slices, one a work-group (each recomputes
// s^T and dp^T over the whole head dim: 6 products where one work-group takes 4), for head dims whose dk and
// dv accumulators and k's and v's fragments do not fit the registers at once (128: 64 + 64 + 64 a lane)
#ifndef DSPLIT
#define DSPLIT 1
#endif
#define DBS (DB / DSPLIT)        // 8-column blocks of a slice of dk and dv
#if DSPLIT < 1 || (DB % (2 * DSPLIT))
#error "attention_mma.cl: DSPLIT slices of whole pairs of 8-column blocks"
#endif

// PREFETCH 1: the forward's and the dq pass's k and v tiles in a two-stage ring filled by cp.async, tile n + 1
// in flight while tile n is computed (twice the tiles' local memory); 0: each tile loaded by the work-items
// between two barriers
#ifndef PREFETCH
#define PREFETCH 0
#endif
// the ring's stages: 2; 1 (the wgmma forward and dq pass at head dim 128 with 64-key tiles: q, k and v fill
// 48 KB) issues each tile once every warp is done with the last one and waits for it at once, the SM's other
// work-group computing meanwhile
#ifndef KV_STAGES
#define KV_STAGES 2
#endif
#if KV_STAGES != 2 && !(KV_STAGES == 1 && PREFETCH && MMA_WG && HEAD_DIM == 128)
#error "attention_mma.cl KV_STAGES: 2, or 1 with PREFETCH on the warpgroup units at head dim 128 (KV_SPLIT)"
#endif
#define KV_STAGE(it) (KV_STAGES == 2 ? (it) & 1 : 0)   // the ring stage of key tile `it`
// rows of the forward's and dq's k and v buffers: the ring's stages, and the BM rows of q (and dO) that pass
// through them first
#define KV_ROWS ((1 + PREFETCH) * BN > BM ? (1 + PREFETCH) * BN : BM)


// the values v of 8-key block jb (accumulator layout: v[0], v[1] row g, v[2], v[3] row g + 8) into the A
// fragment of the k step that holds it, rounded to T
#define PACK_A(a, jb, v)                                                                                \
    do {                                                                                                \
        a[(jb) >> 1][((jb) & 1) * 2] = pack2(v[0], v[1]);                                               \
        a[(jb) >> 1][((jb) & 1) * 2 + 1] = pack2(v[2], v[3]);                                           \
    } while (0)


#ifdef MMA_EMULATE
// one float as the input's 16-bit pattern (round to nearest even)
inline uint to_bits16(const float x) {
#if defined(IS_BF16)
    return nc_float_to_bf16(x);
#else
    return nc_f2h(x);
#endif
}
// two of them as an A fragment register
inline uint pack2(const float lo, const float hi) { return to_bits16(lo) | (to_bits16(hi) << 16); }
#else
// two floats rounded to nearest even in one instruction (sm_80+; the integer rounding took ~8 a value)
inline uint pack2(const float lo, const float hi) {
    uint r;
#if defined(IS_BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}
#endif


// rows first .. first + count - 1 of an operand (row stride in elements) into local rows of DPAD, 16 bytes
// a work-item at a time; rows at or past `limit` are zeros. Where the work-group's width is a multiple of a
// row's chunks (CH), a work-item keeps one column of chunks and steps its pointer by whole rows: no division
// and no 64-bit multiply a chunk (they were most of the forward's integer instructions)
#if THREADS % CH == 0
#define ROW_STEP (THREADS / CH)
// A fixed trip count (count is a constant once inlined), unrolled: no remainder loop, and no row check
// where count is a multiple of the step (the loop had become ~30 instructions a 16-byte copy in the forward)
#define TILE_CHUNKS(tid, first, row_stride, base)                                                       \
    const int ch = (tid) % CH;                                                                          \
    __global const ushort *src = (base) + ((long)(first) + (tid) / CH) * (row_stride) + ch * 8;         \
    const long step = (long)ROW_STEP * (row_stride);                                                    \
    _Pragma("unroll")                                                                                   \
    for (int i_ = 0, r = (tid) / CH; i_ < (count + ROW_STEP - 1) / ROW_STEP; ++i_, r += ROW_STEP, src += step) \
        if (count % ROW_STEP == 0 || r < count)
#else
#define TILE_CHUNKS(tid, first, row_stride, base)                                                       \
    for (int c = (tid), r = c / CH, ch = c % CH; c < count * CH;                                        \
         c += THREADS, r = c / CH, ch = c % CH)                                                         \
        for (__global const ushort *src = (base) + ((long)(first) + r) * (row_stride) + ch * 8; src; src = 0)
#endif
inline void load_tile(__local ushort *dst, __global const ushort *base, const long row_stride, const int first,
                      const int count, const int limit, const int tid) {
    TILE_CHUNKS(tid, first, row_stride, base) {
        uint4 x = (uint4)(0);
        if (first + r < limit) x = *(__global const uint4 *)src;
        *(__local uint4 *)(dst + r * DPAD + ch * 8) = x;
    }
}

// the same through cp.async (PREFETCH): the copies fly until CP_WAIT; rows at or past `limit` zero-filled
inline void issue_tile(__local ushort *dst, __global const ushort *base, const long row_stride, const int first,
                       const int count, const int limit, const int tid) {
    TILE_CHUNKS(tid, first, row_stride, base) {
        const bool in = first + r < limit;
        nc_cp_async16(dst + r * DPAD + ch * 8, in ? src : base, in ? 16 : 0);
    }
}

// ldmatrix row addresses by lane L: the warp's 16 q rows at k step kk (A); keys jb * 8 .. + 15 at k step
// kk (B of q k^T: two 8-key blocks, k halves); keys kk * 16 .. + 15 of v at columns db * 8 .. + 15 (B of
// p v, transposed)
#define Q_ROWS(L) (ks + (warp * WROWS + rb * 16 + ((L) & 15)) * DPAD + kk * 16 + ((L) >> 4) * 8)
#define K_ROWS(L) (ks + (jb * 8 + ((L) >> 4) * 8 + ((L) & 7)) * DPAD + kk * 16 + (((L) >> 3) & 1) * 8)
#define V_ROWS(L) (vs + (kk * 16 + (((L) >> 3) & 1) * 8 + ((L) & 7)) * DPAD + (db + ((L) >> 4)) * 8)

// The loop over streamed tiles of ROWS rows (up to END) of two operands A and B (bases, row strides) into the
// local buffers abuf, bbuf: STREAM_BEGIN before the loop (`it` counts its tiles, r0 their first rows),
// STREAM_NEXT at the top of each pass, which names the tile's buffers `as_`, `bs_` and leaves the tile
// visible to every work-item. TILE_ELEMS, ISSUE_TILE and STREAM_FENCE are the layout's (MMA_WG below: the
// dq pass's tiles swizzled for the warpgroup units, and fenced for their reads).
#define TILE_ELEMS(rows) ((rows) * DPAD)
#define ISSUE_TILE(dst, base, stride, first, count, limit, tid) issue_tile(dst, base, stride, first, count, limit, tid)
#define STREAM_FENCE()
#if PREFETCH && KV_STAGES == 2
#define STREAM_BEGIN_AT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, r0)                      \
    barrier(CLK_LOCAL_MEM_FENCE);       /* the reads of the first stage before the loop are done */     \
    if ((r0) < (END)) {                                                                                 \
        ISSUE_TILE(abuf, abase, astride, r0, ROWS, END, tid);                                           \
        ISSUE_TILE(bbuf, bbase, bstride, r0, ROWS, END, tid);                                           \
    }                                                                                                   \
    CP_COMMIT()
#define STREAM_NEXT_AT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, r0, as_, bs_)              \
    __local ushort *const as_ = (abuf) + (it & 1) * TILE_ELEMS(ROWS);                                   \
    __local ushort *const bs_ = (bbuf) + (it & 1) * TILE_ELEMS(ROWS);                                   \
    barrier(CLK_LOCAL_MEM_FENCE);       /* every warp is done with the tile before: its stage is free */ \
    if ((r0) + (ROWS) < (END)) {                                                                        \
        ISSUE_TILE((abuf) + ((it + 1) & 1) * TILE_ELEMS(ROWS), abase, astride, (r0) + (ROWS), ROWS, END, tid); \
        ISSUE_TILE((bbuf) + ((it + 1) & 1) * TILE_ELEMS(ROWS), bbase, bstride, (r0) + (ROWS), ROWS, END, tid); \
    }                                                                                                   \
    CP_COMMIT();                                                                                        \
    CP_WAIT1();                         /* this work-item's copies of the tile have landed */            \
    STREAM_FENCE();                                                                                     \
    barrier(CLK_LOCAL_MEM_FENCE)        /* ... and everyone's */
#else
#define STREAM_BEGIN_AT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, r0)
#define STREAM_NEXT_AT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, r0, as_, bs_)              \
    __local ushort *const as_ = (abuf), *const bs_ = (bbuf);                                            \
    barrier(CLK_LOCAL_MEM_FENCE);       /* every warp is done with the tile before */                    \
    load_tile(as_, abase, astride, r0, ROWS, END, tid);                                                 \
    load_tile(bs_, bbase, bstride, r0, ROWS, END, tid);                                                 \
    barrier(CLK_LOCAL_MEM_FENCE)
#endif
#define STREAM_BEGIN(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END)                             \
    STREAM_BEGIN_AT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, 0)
#define STREAM_NEXT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, as_, bs_)                     \
    STREAM_NEXT_AT(abuf, bbuf, abase, astride, bbase, bstride, ROWS, END, j0, as_, bs_)

// acc[..][nb], acc[..][nb + 1] += a[..][kk] times the two 8-wide B fragments one ldmatrix.x4 reads at ROWS
// (transposed with TRANS), for the R blocks AT names: the step both loops below take
#define MMA_B_PAIR(acc, a, kk, nb, ROWS, TRANS, R, AT)                                                  \
    do {                                                                                                \
        uint r_[4];                                                                                     \
        LDSM(r_, ROWS, TRANS);                                                                          \
        const uint b0_[2] = {r_[0], r_[1]}, b1_[2] = {r_[2], r_[3]};                                    \
        MMA_UNROLL                                                                                      \
        for (int rb_ = 0; rb_ < (R); ++rb_) {                                                           \
            MMA(AT(acc, rb_)[nb], AT(a, rb_)[kk], b0_, AT(acc, rb_)[nb]);                               \
            MMA(AT(acc, rb_)[(nb) + 1], AT(a, rb_)[kk], b1_, AT(acc, rb_)[(nb) + 1]);                   \
        }                                                                                               \
    } while (0)
// acc[NBLK][4] += A (16 x DK k steps, fragments a[DK][4]) times the rows of a local tile seen as B ("col":
// its rows are the n side), ROWS(L) the ldmatrix addresses of (jb, kk); for R row blocks at once, AT(x, i)
// naming block i of acc and a (RB_AT: x[i]; ONE_AT: x itself, one block): each B fragment pair read from
// local memory once for the R blocks
#define RB_AT(x, i) x[i]
#define ONE_AT(x, i) x
#define MMA_NT_BLOCKS(acc, a, NBLK, ROWS, R, AT)                                                        \
    MMA_UNROLL                                                                                          \
    for (int kk = 0; kk < DK; ++kk)                                                                     \
        MMA_UNROLL                                                                                      \
        for (int jb = 0; jb < (NBLK); jb += 2) MMA_B_PAIR(acc, a, kk, jb, ROWS, false, R, AT)
// acc[DB][4] += A (16 x KSTEPS * 16, fragments a[KSTEPS][4]) times a local tile's rows kk * 16 .. (k side);
// R blocks and AT as MMA_NT_BLOCKS
#define MMA_KN_BLOCKS(acc, a, KSTEPS, ROWS, R, AT, NDB)                                                 \
    MMA_UNROLL                                                                                          \
    for (int kk = 0; kk < (KSTEPS); ++kk)                                                               \
        MMA_UNROLL                                                                                      \
        for (int db = 0; db < (NDB); db += 2) MMA_B_PAIR(acc, a, kk, db, ROWS, true, R, AT)
// one block (the dk/dv pass: acc[..][4], a[..][4]); the warp's RB blocks (acc[RB][..][4], a[RB][..][4])
#define MMA_NT(acc, a, NBLK, ROWS) MMA_NT_BLOCKS(acc, a, NBLK, ROWS, 1, ONE_AT)
#define MMA_KN(acc, a, KSTEPS, ROWS) MMA_KN_BLOCKS(acc, a, KSTEPS, ROWS, 1, ONE_AT, DB)
// the dk/dv pass's slice of dk and dv (DSPLIT): its DBS blocks from column block KN_COL0 of the tile
#define MMA_KN_SLICE(acc, a, KSTEPS, ROWS) MMA_KN_BLOCKS(acc, a, KSTEPS, ROWS, 1, ONE_AT, DBS)
#define MMA_NT_RB(acc, a, NBLK, ROWS) MMA_NT_BLOCKS(acc, a, NBLK, ROWS, RB, RB_AT)
#define MMA_KN_RB(acc, a, KSTEPS, ROWS) MMA_KN_BLOCKS(acc, a, KSTEPS, ROWS, RB, RB_AT, DB)

// MMA_WG 1: the score products on Hopper's warpgroup matrix units (wgmma, PTX sm_90a behind the "//NCWG "
// prefix, netcl.core.ptx): s = q k^T and o += p v in the forward (MMA_PASS 1), s = q k^T and dp = dO v^T in
// the dq pass (2), s^T = k q^T and dp^T = v dO^T in the dk/dv pass (3). A warpgroup (four warps) owns 64 rows
// (queries, or keys) and takes them as wgmma's A operands: the forward's q rows swizzled in local memory (by
// descriptor), the backward's q and dO, or k and v, as fragments in registers (a warp's 16 rows are mma.sync's
// A fragment; WG_SS: in local memory too), and the streamed tiles (k and v, or q and dO: 64 rows of
// HEAD_DIM = 64, 128-byte rows swizzled as wgmma's canonical 128-byte K-major layout; at HEAD_DIM 128 32-key
// or 16-query tiles, each row two such halves, WG_CHUNK_H, so that all three passes fit 48 KB: the dq pass
// with q in local memory and dO in registers, the dk/dv pass with WG_SS) are its B operands,
// read by the units from local memory: no ldmatrix for these products (the mma.sync passes spent about half
// their time on ldmatrix traffic). The forward's p v takes p's fragments from registers (packed from the
// accumulators, as for mma.sync) and reads the v tile's same bytes MN-major (wgmma's imm-trans-b). The
// accumulators of a warp are laid out as mma.sync's, so the masks, exponentials and dropout are the same
// code. The backward's third products (dq += ds k; dv += (p z)^T dO and dk += ds^T q) take ds, p from
// registers too and read their tiles MN-major with WG_KN 1, else run on mma.sync, their fragments read by
// ldmatrix.trans from the swizzled rows. (Two register-sourced wgmma operands in one loop need WG_FRESH
// below: without it every tile after the first was wrong on the H200, which cost the seventeenth session its
// dk/dv attempt; bench/NOTES.md, seventeenth and eighteenth sessions.)
#ifndef MMA_WG
#define MMA_WG 0
#endif
// WG_KN 1 (with MMA_WG): the products whose tile is read MN-major on wgmma too, each k = 64 product in one
// asm statement (WGR_TILE): the forward's o += p v, the dq pass's dq += ds k, the dk/dv pass's dv += (p z)^T
// dO and dk += ds^T q; 0: those on mma.sync (the tiles' fragments by ldmatrix.trans)
#ifndef WG_KN
#define WG_KN 0
#endif
// WG_SS 1 (the backward passes, with MMA_WG, 64 rows a work-group): the pass's own rows (q and dO; k and v)
// swizzled in local memory as the first products' A operands by descriptor, as the forward's q (no fresh
// copies): 48 KB with the ring; the dq pass's lse and delta pass through the ring's memory before it starts,
// the dk/dv pass reads each query tile's into registers as the tile's products are issued. 0: the rows'
// fragments in registers (WG_FRESH with WG_KN)
#ifndef WG_SS
#define WG_SS 0
#endif
// DKDV_KREG 1 (the dk/dv pass at head dim 128 with 32-row query tiles; not yet measured, off:
// MMA_TILES["dkdv_wg"]["DKDV_KREG"]): k's rows as fragments in registers (s^T's A operand, through WG_FRESH)
// instead of local memory, which frees 16 KB for a second stage of query tiles: the next tile's copy flies
// while this one computes, where the one stage waited for it at every tile's top
#ifndef DKDV_KREG
#define DKDV_KREG 0
#endif
#if MMA_WG
#if (MMA_PASS == 1 || MMA_PASS == 2) && HEAD_DIM == 128 \
    && (!(BN == 32 && KV_STAGES == 2) && !(BN == 64 && KV_STAGES == 1) \
        || BM != 64 || RB != 1 || !PREFETCH || !WG_KN || WG_SS)
#error "attention_mma.cl MMA_WG forward and dq pass at HEAD_DIM 128: BN 32 (two stages) or 64 (one), one warpgroup (BM 64), RB 1, the ring, WG_KN"
#elif (MMA_PASS == 1 || MMA_PASS == 2) && HEAD_DIM != 128 \
    && (HEAD_DIM != 64 || BN != 64 || RB != 1 || (BM % 64) || !PREFETCH)
#error "attention_mma.cl MMA_WG forward and dq pass: HEAD_DIM 64, BN 64, RB 1, 64 rows a warpgroup, and the ring"
#elif MMA_PASS == 3 && HEAD_DIM != 128 && (HEAD_DIM != 64 || BQ != 64 || (BM % 64) || !DKDV_RING || DSPLIT != 1)
#error "attention_mma.cl MMA_WG dk/dv pass: HEAD_DIM 64, BQ 64, 64 keys a warpgroup, and the ring"
#elif MMA_PASS == 3 && HEAD_DIM == 128 && ((BQ != 16 && BQ != 32) || (BQ == 32) != (DKDV_STAGES == 1 || DKDV_KREG) \
      || (DKDV_KREG && (BQ != 32 || DKDV_STAGES != 2)) || BM != 64 || !DKDV_RING || DSPLIT != 1 || !WG_SS || !WG_KN)
#error "attention_mma.cl MMA_WG dk/dv pass at HEAD_DIM 128: BQ 16 (two stages) or 32 (one; two with DKDV_KREG), one warpgroup (BM 64), the ring, WG_SS, WG_KN"
#elif MMA_PASS != 1 && MMA_PASS != 2 && MMA_PASS != 3
#error "attention_mma.cl MMA_WG: the forward (MMA_PASS 1), the dq (2) or the dk/dv pass (3) alone"
#endif
// The one-stage forward and dq passes at head dim 128 (64-key tiles) refill their k and v buffers each as
// soon as the tile's last product that reads it is done, in cp.async groups of their own: the forward's next
// k tile flies while p and o += p v are formed, its next v tile while s and p are; the dq pass's next v tile
// while ds and dq += ds k are, its next k tile while dp's products run (dp issued first, then s), and it
// takes dq += ds k as one batch of eight products. H100, bfloat16, B=8 H=16 S=2048 D=128, one call, against
// both tiles issued at the top of the loop and waited for together: forward 0.667 -> 0.619 ms full, 0.403
// -> 0.377 causal; dq 0.961 -> 0.882, 0.588 -> 0.538 (bench/NOTES.md, thirty-first session).
#define KV_SPLIT (KV_STAGES == 1)
// The dk/dv pass over 32-row query tiles (one stage; two with DKDV_KREG) overlaps its products with its own
// element-wise work: s^T's and dp^T's products in two batches, p^T formed while dp^T's run, dv's products
// issued before ds^T is formed, dk's and dv's waited for at once. Same call as above (one stage): 1.572 ->
// 1.501 ms full, 0.825 -> 0.782 causal.
#define WG_OVERLAP (HEAD_DIM == 128 && MMA_PASS == 3 && BQ == 32)
#include "wgmma.cl"
#define WG_ROW 128                       // bytes of a streamed row in local memory (64 16-bit values)
// chunk `ch` (16 bytes) of row r of a tile, swizzled (wgmma.cl's swizzle of byte r * 128 + ch * 16)
#define WG_CHUNK(r, ch) ((r) * WG_ROW + ((((ch) ^ (r)) & 7) << 4))
// HEAD_DIM 128 (each pass): a tile of `rows` rows is two such tiles one after the other, columns 0-63 then
// 64-127 (each 64-column half the layout above: the descriptors of head dim 64 read either half), chunk ch
// of row r at WG_CHUNK_H
#define WG_CHUNK_H(r, ch, rows) (((ch) >> 3) * (rows) * WG_ROW + WG_CHUNK(r, (ch) & 7))
// ldmatrix row addresses of the A fragment of k step kk of a warp's 16 rows in such a tile of BM rows at ksb
// (the dq pass's dO at head dim 128), as WARP_ROWS
#define GW_ROWS(L)                                                                                      \
    ((__local ushort *)((__local uchar *)ksb + WG_CHUNK_H(warp * 16 + ((L) & 15), kk * 2 + ((L) >> 4), BM)))
// the same for the dk/dv pass's k rows (KEYS of them) passing through the query stages (DKDV_KREG)
#define KW_ROWS(L)                                                                                      \
    ((__local ushort *)((__local uchar *)qs4 + WG_CHUNK_H(warp * 16 + ((L) & 15), kk * 2 + ((L) >> 4), KEYS)))
// ldmatrix row addresses of the swizzled tile: rows kk * 16 .. + 15 (the k side) at columns db * 8 .. + 15,
// as KN_ROWS
#define KN_SWIZZLED(tile, L)                                                                            \
    ((__local ushort *)((__local uchar *)(tile) + WG_CHUNK(kk * 16 + (((L) >> 3) & 1) * 8 + ((L) & 7), db + ((L) >> 4))))
// B of k step kk of a tile at local address `at`: K-major (n = query rows, k = head dim; 32 bytes a step along
// the rows, 8-row groups 1024 bytes apart)
#define DESC_KM(at, kk) wg_desc((at) + (kk) * 32, 16, 1024, SWZ_MODE(WG_ROW))
// the same over a whole head dim of DK k steps, the tile `rows` rows (its halves at HEAD_DIM 128, WG_CHUNK_H)
#define DESC_KMH(at, kk, rows) DESC_KM((at) + ((kk) >> 2) * (rows) * WG_ROW, (kk) & 3)
// the same tile's bytes read MN-major (k = the tile's rows, n = head dim: 16 rows of 128 bytes a step; 8-row
// groups 1024 bytes apart; the head dim one 64-wide block, so the leading offset is not read)
#define DESC_MN(at, kk) wg_desc((at) + (kk) * 16 * WG_ROW, 64 * WG_ROW, 1024, SWZ_MODE(WG_ROW))

// rows first .. first + count - 1 of an operand into a stage (cp.async, rows at or past `limit` zero-filled)
inline void issue_tile_wg(__local ushort *dst, __global const ushort *base, const long row_stride, const int first,
                          const int count, const int limit, const int tid) {
    TILE_CHUNKS(tid, first, row_stride, base) {
        const bool in = first + r < limit;
        nc_cp_async16((__local uchar *)dst + WG_CHUNK_H(r, ch, count), in ? src : base, in ? 16 : 0);
    }
}

#ifdef MMA_EMULATE
// element (row n, k) of a B operand as the units read it through descriptor `desc` (an offset in `tile`):
// K-major at n / 8 * SBO + n % 8 * 128 + 2 k, MN-major at k / 8 * SBO + k % 8 * 128 + 2 n, then swizzled
inline float wg_b(__local const uchar *tile, const ulong desc, const int n, const int k, const int mn_major) {
    const uint start = (uint)(desc & 0x3fffu) << 4, sbo = (uint)((desc >> 32) & 0x3fffu) << 4;
    const uint at = mn_major ? start + (k / 8) * sbo + (k % 8) * 128 + n * 2
                             : start + (n / 8) * sbo + (n % 8) * 128 + k * 2;
    return lane_value(*(__local const ushort *)(tile + swizzle(at, WG_ROW)));
}
// acc (64 x 8 nblk of the warpgroup; this lane's fragments) = A (this warp's 16 x 16 fragment a, the other
// warps' theirs) x the 16 x 8 nblk B of `desc` (+ acc where `accumulate`): the A fragments through scratch
// (the warpgroup's 64 x 16)
inline void wg_emulate_rs(float acc[][4], const uint a[4], __local const uchar *tile, const ulong desc,
                          const int accumulate, const int mn_major, __local float *sa, const int wq, const int g,
                          const int t, const int nblk) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        sa[(wq * 16 + g) * 16 + 2 * t + h] = lane_value(a[0] >> (16 * h));
        sa[(wq * 16 + g + 8) * 16 + 2 * t + h] = lane_value(a[1] >> (16 * h));
        sa[(wq * 16 + g) * 16 + 2 * t + 8 + h] = lane_value(a[2] >> (16 * h));
        sa[(wq * 16 + g + 8) * 16 + 2 * t + 8 + h] = lane_value(a[3] >> (16 * h));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = 0; j < nblk; ++j)
        for (int e = 0; e < 4; ++e) {
            const int r = wq * 16 + g + 8 * (e >> 1), c = 8 * j + 2 * t + (e & 1);
            float s = accumulate ? acc[j][e] : 0.0f;
            for (int k = 0; k < 16; ++k) s += sa[r * 16 + k] * wg_b(tile, desc, c, k, mn_major);
            acc[j][e] = s;
        }
    barrier(CLK_LOCAL_MEM_FENCE);
}
// acc (64 x 8 nblk) = A x B (+ acc where `accumulate`), both read from local memory through K-major
// descriptors (the warpgroup's 64 rows of A: this lane's rows of its warp)
inline void wg_emulate_ss(float acc[][4], __local const uchar *atile, const ulong adesc, __local const uchar *btile,
                          const ulong bdesc, const int accumulate, const int wq, const int g, const int t,
                          const int nblk) {
    for (int j = 0; j < nblk; ++j)
        for (int e = 0; e < 4; ++e) {
            const int r = wq * 16 + g + 8 * (e >> 1), c = 8 * j + 2 * t + (e & 1);
            float s = accumulate ? acc[j][e] : 0.0f;
            for (int k = 0; k < 16; ++k) s += wg_b(atile, adesc, r, k, 0) * wg_b(btile, bdesc, c, k, 0);
            acc[j][e] = s;
        }
}
#define WGS(acc, atile, adesc, btile, bdesc, accumulate)                                                \
    wg_emulate_ss(acc, (__local const uchar *)(atile), adesc, (__local const uchar *)(btile), bdesc, accumulate, \
                  warp & 3, g, t, 8)
#define WGS32(acc, atile, adesc, btile, bdesc, accumulate)                                              \
    wg_emulate_ss(acc, (__local const uchar *)(atile), adesc, (__local const uchar *)(btile), bdesc, accumulate, \
                  warp & 3, g, t, 4)
#define WGR_(acc, a, tile, desc, accumulate, TRANS)                                                     \
    wg_emulate_rs(acc, a, (__local const uchar *)(tile), desc, accumulate, TRANS,                       \
                  scratch_a + (warp >> 2) * 64 * 16, warp & 3, g, t, 8)
#define WGR32(acc, a, tile, desc, accumulate)                                                           \
    wg_emulate_rs(acc, a, (__local const uchar *)(tile), desc, accumulate, 0,                           \
                  scratch_a + (warp >> 2) * 64 * 16, warp & 3, g, t, 4)
#define WGR_TILE(acc, a, tile, at, DESC, accumulate, TRANS)                                             \
    do {                                                                                                \
        for (int kk_ = 0; kk_ < 4; ++kk_) WGR_(acc, a[kk_], tile, DESC(at, kk_), kk_ > 0 || (accumulate), TRANS); \
    } while (0)
#define WGR_TILE2(acc, a, tile, at, DESC, accumulate, TRANS)                                            \
    do {                                                                                                \
        for (int kk_ = 0; kk_ < 2; ++kk_) WGR_(acc, a[kk_], tile, DESC(at, kk_), kk_ > 0 || (accumulate), TRANS); \
    } while (0)
#define WGS16(acc, atile, adesc, btile, bdesc, accumulate)                                              \
    wg_emulate_ss(acc, (__local const uchar *)(atile), adesc, (__local const uchar *)(btile), bdesc, accumulate, \
                  warp & 3, g, t, 2)
#define WGR_HALVES1(acc, a, tile, d0, d1, TRANS)                                                        \
    do {                                                                                                \
        WGR_(acc, a[0], tile, d0, 1, TRANS);                                                            \
        WGR_((acc + 8), a[0], tile, d1, 1, TRANS);                                                      \
    } while (0)
#define WGR_HALVES2_ASYNC(acc, a, tile, d00, d01, d10, d11, TRANS)                                     \
    do {                                                                                                \
        WGR_(acc, a[0], tile, d00, 1, TRANS);                                                           \
        WGR_(acc, a[1], tile, d01, 1, TRANS);                                                           \
        WGR_((acc + 8), a[0], tile, d10, 1, TRANS);                                                     \
        WGR_((acc + 8), a[1], tile, d11, 1, TRANS);                                                     \
    } while (0)
#define WG_WAIT_ACC(x, y)
#define WG_WAIT_ACC16(x)
#define WG_WAIT_ACC16X2(x, y)
#define WG_WAIT_ACC8X2(x, y)
#define WGR_TILE_HALVES(acc, a, tile, at0, at1, DESC, TRANS)                                           \
    do {                                                                                                \
        WGR_TILE(acc, a, tile, at0, DESC, 1, TRANS);                                                    \
        WGR_TILE((acc + 8), a, tile, at1, DESC, 1, TRANS);                                              \
    } while (0)
#define WG_WAIT1_ACC16(x)
#define WG_WAIT_HALVES2(x, y)
#else
#define WG_TYPE "bf16"
#if !defined(IS_BF16)
#undef WG_TYPE
#define WG_TYPE "f16"
#endif
#define WG_ACC4(x, j) "+f"(x[j][0]), "+f"(x[j][1]), "+f"(x[j][2]), "+f"(x[j][3])
#define WG_ACC(x) WG_ACC4(x, 0), WG_ACC4(x, 1), WG_ACC4(x, 2), WG_ACC4(x, 3), WG_ACC4(x, 4), WG_ACC4(x, 5),    \
                  WG_ACC4(x, 6), WG_ACC4(x, 7)
#define WG_ACC16(x) WG_ACC4(x, 0), WG_ACC4(x, 1), WG_ACC4(x, 2), WG_ACC4(x, 3)
#define WG_ACC8(x) WG_ACC4(x, 0), WG_ACC4(x, 1)
// acc (m64n64, 32 floats a lane) = A x B (both from local memory through K-major descriptors) +
// (accumulate ? acc : 0)
#define WGS(acc, atile, adesc, btile, bdesc, accumulate)                                                \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32." \
                     WG_TYPE "." WG_TYPE " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,"    \
                     "%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0; }")   \
                 : WG_ACC(acc) : "l"(adesc), "l"(bdesc), "r"(accumulate) : "memory")
// the same at m64n32 (16 floats a lane: the forward's scores at head dim 128, 32-key tiles)
#define WGS32(acc, atile, adesc, btile, bdesc, accumulate)                                              \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %18, 0; wgmma.mma_async.sync.aligned.m64n32k16.f32." \
                     WG_TYPE "." WG_TYPE " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, " \
                     "p, 1, 1, 0, 0; }")                                                                \
                 : WG_ACC16(acc) : "l"(adesc), "l"(bdesc), "r"(accumulate) : "memory")
// the same at m64n16 (8 floats a lane: the dk/dv pass's s^T and dp^T at head dim 128, 16-row query tiles)
#define WGS16(acc, atile, adesc, btile, bdesc, accumulate)                                              \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %10, 0; wgmma.mma_async.sync.aligned.m64n16k16.f32." \
                     WG_TYPE "." WG_TYPE " {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0; }")         \
                 : WG_ACC8(acc) : "l"(adesc), "l"(bdesc), "r"(accumulate) : "memory")
// the same at m64n32, B K-major (the dq pass's dp at head dim 128)
#define WGR32(acc, a, tile, desc, accumulate)                                                           \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %21, 0; wgmma.mma_async.sync.aligned.m64n32k16.f32." \
                     WG_TYPE "." WG_TYPE " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "     \
                     "{%16,%17,%18,%19}, %20, p, 1, 1, 0; }")                                           \
                 : WG_ACC16(acc) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate) \
                 : "memory")
// acc (m64n64, 32 floats a lane) = a (registers) x B (descriptor) + (accumulate ? acc : 0); TRANS 1: B read
// MN-major
#define WGR_(acc, a, tile, desc, accumulate, TRANS)                                                     \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %37, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32." \
                     WG_TYPE "." WG_TYPE " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,"    \
                     "%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, " \
                     #TRANS "; }")                                                                      \
                 : WG_ACC(acc) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate) : "memory")
// acc (m64n64) = A (k = 64: this lane's fragments a[0..3] from registers) x the 64 x 64 B tile at local
// address `at` (DESC(at, kk): its descriptors; TRANS 1: read MN-major) + (accumulate ? acc : 0): the fence,
// the four products, the commit and the wait in one asm statement (nothing the compiler emits can come
// between them; these products are waited for at once anyway). Their A operand is packed each tile: the
// first products' loop-invariant A goes through WG_FRESH beside them.
// One m64n64k16 product with A from registers, as asm text: accumulators ACC, A's registers, B's
// descriptor D, predicate P (accumulate); WG_ACC_0 / WG_ACC_1: the first / second 32 operands.
#define WG_RS_PRODUCT(ACC, A, D, P, TRANS)                                                              \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_TYPE "." WG_TYPE " {" ACC "}, {" A "}, " D ", " P ", 1, 1, " \
    #TRANS "; "
#define WG_ACC_0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
                 "%25,%26,%27,%28,%29,%30,%31"
#define WG_ACC_1 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
                 "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_RS_STEP(A, D, P, TRANS) WG_RS_PRODUCT(WG_ACC_0, A, D, P, TRANS)
#define WGR_TILE(acc, a, tile, at, DESC, accumulate, TRANS)                                             \
    asm volatile(NCW("{ .reg .pred p, q; setp.ne.b32 p, %52, 0; setp.ne.b32 q, %53, 0; "                \
                     "wgmma.fence.sync.aligned; "                                                      \
                     WG_RS_STEP("%32,%33,%34,%35", "%48", "p", TRANS)                                   \
                     WG_RS_STEP("%36,%37,%38,%39", "%49", "q", TRANS)                                   \
                     WG_RS_STEP("%40,%41,%42,%43", "%50", "q", TRANS)                                   \
                     WG_RS_STEP("%44,%45,%46,%47", "%51", "q", TRANS)                                   \
                     "wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; }")             \
                 : WG_ACC(acc)                                                                          \
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]),  \
                   "r"(a[1][2]), "r"(a[1][3]), "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]),  \
                   "r"(a[3][0]), "r"(a[3][1]), "r"(a[3][2]), "r"(a[3][3]), "l"(DESC(at, 0)),            \
                   "l"(DESC(at, 1)), "l"(DESC(at, 2)), "l"(DESC(at, 3)), "r"(accumulate), "r"(1)        \
                 : "memory")
// acc (m64n128: acc[0..15], columns 0-63 then 64-127) += A (k = 16: this lane's fragment a[0]) x a 16-row
// tile stored as two 64-column halves, d0 and d1 their descriptors (TRANS 1: read MN-major): both products,
// the commit and the wait in one asm statement (the dk/dv pass's third products at head dim 128)
#define WGR_HALVES1(acc, a, tile, d0, d1, TRANS)                                                        \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %70, 0; wgmma.fence.sync.aligned; "                \
                     WG_RS_PRODUCT(WG_ACC_0, "%64,%65,%66,%67", "%68", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%64,%65,%66,%67", "%69", "p", TRANS)                         \
                     "wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; }")             \
                 : WG_ACC(acc), WG_ACC((acc + 8))                                                       \
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "l"(d0), "l"(d1), "r"(1)      \
                 : "memory")
// acc (m64n128: acc[0..15], columns 0-63 then 64-127) += A (k = 64: a[0..3] from registers) x two 64 x 64 B
// tiles at local addresses at0 and at1 (DESC(at, kk): their descriptors): the eight products in one batch,
// waited for once (the one-stage dq pass's dq += ds k at head dim 128)
#define WGR_TILE_HALVES(acc, a, tile, at0, at1, DESC, TRANS)                                           \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %88, 0; wgmma.fence.sync.aligned; "                \
                     WG_RS_PRODUCT(WG_ACC_0, "%64,%65,%66,%67", "%80", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_0, "%68,%69,%70,%71", "%81", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_0, "%72,%73,%74,%75", "%82", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_0, "%76,%77,%78,%79", "%83", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%64,%65,%66,%67", "%84", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%68,%69,%70,%71", "%85", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%72,%73,%74,%75", "%86", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%76,%77,%78,%79", "%87", "p", TRANS)                         \
                     "wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; }")             \
                 : WG_ACC(acc), WG_ACC((acc + 8))                                                       \
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]),  \
                   "r"(a[1][2]), "r"(a[1][3]), "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]),  \
                   "r"(a[3][0]), "r"(a[3][1]), "r"(a[3][2]), "r"(a[3][3]), "l"(DESC(at0, 0)),           \
                   "l"(DESC(at0, 1)), "l"(DESC(at0, 2)), "l"(DESC(at0, 3)), "l"(DESC(at1, 0)),          \
                   "l"(DESC(at1, 1)), "l"(DESC(at1, 2)), "l"(DESC(at1, 3)), "r"(1)                      \
                 : "memory")
// acc (m64n128, as WGR_HALVES1) += A (k = 32: a[0..1], a 32-row tile) x B (dXY the descriptor of half X's k
// step Y): the four products and their commit, not waited for (WG_OVERLAP: they run while the work-items go
// on; WG_WAIT_HALVES2 waits)
#define WGR_HALVES2_ASYNC(acc, a, tile, d00, d01, d10, d11, TRANS)                                     \
    asm volatile(NCW("{ .reg .pred p; setp.ne.b32 p, %76, 0; wgmma.fence.sync.aligned; "                \
                     WG_RS_PRODUCT(WG_ACC_0, "%64,%65,%66,%67", "%72", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_0, "%68,%69,%70,%71", "%73", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%64,%65,%66,%67", "%74", "p", TRANS)                         \
                     WG_RS_PRODUCT(WG_ACC_1, "%68,%69,%70,%71", "%75", "p", TRANS)                         \
                     "wgmma.commit_group.sync.aligned; }")                                              \
                 : WG_ACC(acc), WG_ACC((acc + 8))                                                       \
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]),  \
                   "r"(a[1][2]), "r"(a[1][3]), "l"(d00), "l"(d01), "l"(d10), "l"(d11), "r"(1)            \
                 : "memory")
// until every batch is done, x's and y's m64n128 accumulators named as written
#define WG_WAIT_HALVES2(x, y)                                                                           \
    do {                                                                                                \
        asm volatile(NCW("wgmma.wait_group.sync.aligned 0;") : WG_ACC(x), WG_ACC((x + 8)) :: "memory"); \
        asm volatile("" : WG_ACC(y), WG_ACC((y + 8)) :: "memory");                                      \
    } while (0)
// until at most the newest batch is in flight, x's m64n32 accumulators named as written
#define WG_WAIT1_ACC16(x) asm volatile(NCW("wgmma.wait_group.sync.aligned 1;") : WG_ACC16(x) :: "memory")
// WGR_TILE over k = 32 (a[0..1]: a 32-row tile)
#define WGR_TILE2(acc, a, tile, at, DESC, accumulate, TRANS)                                            \
    asm volatile(NCW("{ .reg .pred p, q; setp.ne.b32 p, %42, 0; setp.ne.b32 q, %43, 0; "                \
                     "wgmma.fence.sync.aligned; "                                                      \
                     WG_RS_STEP("%32,%33,%34,%35", "%40", "p", TRANS)                                   \
                     WG_RS_STEP("%36,%37,%38,%39", "%41", "q", TRANS)                                   \
                     "wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; }")             \
                 : WG_ACC(acc)                                                                          \
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]),  \
                   "r"(a[1][2]), "r"(a[1][3]), "l"(DESC(at, 0)), "l"(DESC(at, 1)), "r"(accumulate), "r"(1) \
                 : "memory")
// until every wgmma batch is done: the wait names x's and y's accumulators as written (no read of them
// moves above it)
#define WG_WAIT_ACC(x, y)                                                                               \
    do {                                                                                                \
        asm volatile(NCW("wgmma.wait_group.sync.aligned 0;") : WG_ACC(x) :: "memory");                 \
        asm volatile("" : WG_ACC(y) :: "memory");                                                       \
    } while (0)
#define WG_WAIT_ACC16(x) asm volatile(NCW("wgmma.wait_group.sync.aligned 0;") : WG_ACC16(x) :: "memory")
#define WG_WAIT_ACC8X2(x, y)                                                                            \
    do {                                                                                                \
        asm volatile(NCW("wgmma.wait_group.sync.aligned 0;") : WG_ACC8(x) :: "memory");                \
        asm volatile("" : WG_ACC8(y) :: "memory");                                                      \
    } while (0)
#define WG_WAIT_ACC16X2(x, y)                                                                           \
    do {                                                                                                \
        WG_WAIT_ACC16(x);                                                                               \
        asm volatile("" : WG_ACC16(y) :: "memory");                                                     \
    } while (0)
#endif
// WG_FRESH (the backward passes with WG_KN): the loop-invariant A operand of their first products (q's and dO's, or k's and v's
// fragments) through fresh registers each tile, x ^ a zero neither compiler can fold or hoist out of the
// loop (the cycle counter's top bits, read each tile). Without it ptxas gave those fragments and the A
// operand of the products that follow in the same loop (p, ds, packed each tile) the same registers, so
// every tile after the first read the last tile's p as q (the forward's SASS, H200, driver 580: q's
// fragments' registers reused for the exponentials and p): a wgmma's register A operands look dead to it
// once the wgmma has read them. bench/NOTES.md, eighteenth session.
#ifdef MMA_EMULATE
#define WG_ZERO() 0u
#else
inline uint wg_zero(void) {
    ulong c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    return (uint)(c >> 62);
}
#define WG_ZERO() wg_zero()
#endif
#define WG_FRESH(dst, src)                                                                              \
    uint dst[DK][4];                                                                                    \
    {                                                                                                   \
        const uint z_ = WG_ZERO();                                                                      \
        _Pragma("unroll")                                                                               \
        for (int kk_ = 0; kk_ < DK; ++kk_)                                                              \
            _Pragma("unroll")                                                                           \
            for (int e_ = 0; e_ < 4; ++e_) dst[kk_][e_] = src[kk_][e_] ^ z_;                            \
    }
// B K-major (the tile's rows are the n side)
#define WGR(acc, a, tile, desc, accumulate) WGR_(acc, a, tile, desc, accumulate, 0)
// the third product's B fragments from the swizzled rows; the streamed tiles in that layout, fenced
#define QS_KN_T(L) KN_SWIZZLED(qs, L)
#define VS_KN_T(L) KN_SWIZZLED(vs, L)
#define GS_KN_T(L) KN_SWIZZLED(gs, L)
#define KS_KN_T(L) KN_SWIZZLED(ks, L)
#undef TILE_ELEMS
#define TILE_ELEMS(rows) ((rows) * HEAD_DIM)
#undef ISSUE_TILE
#define ISSUE_TILE(dst, base, stride, first, count, limit, tid) issue_tile_wg(dst, base, stride, first, count, limit, tid)
#undef STREAM_FENCE
#define STREAM_FENCE() FENCE_ASYNC()
// the local addresses of buffers as the descriptors take them (the emulation: offsets in the buffers)
#ifdef MMA_EMULATE
#define WG_BASE(buf) 0u
#else
#define WG_BASE(buf) ((uint)(ulong)(buf))
#endif
#else
#define QS_KN_T(L) QS_KN(L)
#define VS_KN_T(L) V_ROWS(L)
#define GS_KN_T(L) GS_KN(L)
#define KS_KN_T(L) KS_KN(L)
#endif

// the forward's and the dq pass's score products on the units, BN keys wide: m64n32 (head dim 128's 32-key
// tiles) or m64n64; s from local memory (WGS_S), the dq pass's dp from registers (WGR_S); their waits
#if MMA_WG && BN == 32
#define WGS_S WGS32
#define WGR_S WGR32
#define WG_WAIT_S(x) WG_WAIT_ACC16(x)
#define WG_WAIT_S2(x, y) WG_WAIT_ACC16X2(x, y)
#elif MMA_WG
#define WGS_S WGS
#define WGR_S WGR
#define WG_WAIT_S(x) WG_WAIT_ACC(x, x)
#define WG_WAIT_S2(x, y) WG_WAIT_ACC(x, y)
#endif

#if MMA_PASS == 0 || MMA_PASS == 1
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_forward_mma(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), MASK_ARGS, LEN_ARGS, OUT_ARGS,
                           __global ACC *lse, const int HQ, const int GROUP, const int SQ, const int SK,
                           const int causal, const ACC scale, DROP_ARGS)
{
#if MMA_WG   // the ring's stages of unpadded swizzled rows (q has its own buffer below)
    __local uint4 ks4[KV_STAGES * BN * HEAD_DIM / 8], vs4[KV_STAGES * BN * HEAD_DIM / 8];
#else
    __local uint4 ks4[KV_ROWS * DPAD / 8], vs4[KV_ROWS * DPAD / 8];
#endif
    __local ushort *const ksb = (__local ushort *)ks4, *const vsb = (__local ushort *)vs4;
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS * 16 * KSTEP], scratch_b[WARPS * KSTEP * 8], shx[THREADS];
#endif
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int i0 = get_group_id(0) * BM, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const int hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, min(i0 + BM, SQ) - 1, L, SQ);
    __global const ushort *const kb = (__global const ushort *)(k + k_off + b * k_sb + hk * k_sh);
    __global const ushort *const vb = (__global const ushort *)(v + v_off + b * v_sb + hk * v_sh);
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    const long row0 = ((long)b * HQ + h) * SQ + i0;
    // this lane's two rows of each of the warp's RB blocks (r = 0: g, r = 1: g + 8), clamped for the mask's
    // index
    int rloc[RB][2], irow[RB][2];
    #pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
        rloc[rb][0] = warp * WROWS + rb * 16 + g;
        rloc[rb][1] = rloc[rb][0] + 8;
        irow[rb][0] = min(i0 + rloc[rb][0], SQ - 1);
        irow[rb][1] = min(i0 + rloc[rb][1], SQ - 1);
    }

#if MMA_WG
    // q's BM rows swizzled in local memory, wgmma's A operand by descriptor (A from registers here and p's
    // registers in the same loop would need WG_FRESH's copies: ~10% slower; the ring's first wait lands it)
    __local uint4 qw4[BM * HEAD_DIM / 8];
    ISSUE_TILE((__local ushort *)qw4, (__global const ushort *)(q + q_off + b * q_sb + h * q_sh), q_ss, i0, BM, SQ,
               tid);
    CP_COMMIT();
    const uint qat = WG_BASE(qw4) + (warp >> 2) * 64 * WG_ROW;   // this warpgroup's 64 rows (of each half)
#else
    uint qa[RB][DK][4];
    // q's fragments, through the k tile's memory
    {
        __local ushort *const ks = ksb;
        load_tile(ks, (__global const ushort *)(q + q_off + b * q_sb + h * q_sh), q_ss, i0, BM, SQ, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        MMA_UNROLL
        for (int rb = 0; rb < RB; ++rb)
            MMA_UNROLL
            for (int kk = 0; kk < DK; ++kk) LDSM(qa[rb][kk], Q_ROWS, false);
    }
#endif

    float o[RB][DB][4], m[RB][2], l[RB][2];
    #pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
        ZERO_ACC(o[rb], DB);
        m[rb][0] = m[rb][1] = -INFINITY;
        l[rb][0] = l[rb][1] = 0.0f;
    }

#if KV_SPLIT   // the first k tile and the first v tile, each its own group (after q's)
    ISSUE_TILE(ksb, kb, k_ss, 0, BN, jend, tid);
    CP_COMMIT();
    ISSUE_TILE(vsb, vb, v_ss, 0, BN, jend, tid);
    CP_COMMIT();
#else
    STREAM_BEGIN(ksb, vsb, kb, k_ss, vb, v_ss, BN, jend);
#endif
    for (int j0 = 0, it = 0; j0 < jend; j0 += BN, ++it) {
#if KV_SPLIT
        CP_WAIT1();                     // this work-item's copies of k tile it have landed (v's may fly)
        FENCE_ASYNC();
        barrier(CLK_LOCAL_MEM_FENCE);   // ... and everyone's
#else
        STREAM_NEXT(ksb, vsb, kb, k_ss, vb, v_ss, BN, jend, ks, vs);
#endif

        // s = q k^T: each k fragment pair read once for the warp's RB row blocks
        float s[RB][NB][4];
#if MMA_WG
        // (RB 1: s[0] and o[0] are the warpgroup's 64 x 64 accumulators; the first k step overwrites s)
        const uint kat = WG_BASE(ksb) + KV_STAGE(it) * TILE_ELEMS(BN) * 2;
        const uint vat = WG_BASE(vsb) + KV_STAGE(it) * TILE_ELEMS(BN) * 2;
        WG_FENCE();
        #pragma unroll   // (head dim 128: 8 k steps over the two halves of q's and k's rows)
        for (int kk = 0; kk < DK; ++kk) WGS_S(s[0], qw4, DESC_KMH(qat, kk, BM), ksb, DESC_KMH(kat, kk, BN), kk > 0);
        WG_COMMIT();
        WG_WAIT_S(s[0]);
#if KV_SPLIT
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp's s is done: the k buffer takes the next tile
        if (j0 + BN < jend) ISSUE_TILE(ksb, kb, k_ss, j0 + BN, BN, jend, tid);
        CP_COMMIT();                    // (empty after the last tile: the groups stay counted alike)
#endif
#else
        #pragma unroll
        for (int rb = 0; rb < RB; ++rb) ZERO_ACC(s[rb], NB);
        MMA_NT_RB(s, qa, NB, K_ROWS);
#endif

        // scale (here, or in the exponent: sc), mask, the rows' maxima over the tile (a lane's 2 * NB values,
        // then its quad)
        float sc = 1.0f;
        if (!open_tile(j0, BN, i0, L, SQ, causal)) {
            #pragma unroll
            for (int rb = 0; rb < RB; ++rb) {
                SCALE_ACC(s[rb], NB, scale);
                MASK_ROWS(s[rb], irow[rb]);
            }
        } else if (EXP_FUSED && scale > 0.0f) {
            sc = scale;   // the maxima of unscaled scores, scaled after
        } else {
            #pragma unroll
            for (int rb = 0; rb < RB; ++rb) SCALE_ACC(s[rb], NB, scale);
        }
        uint pa[RB][BN / 16][4];
        MMA_UNROLL
        for (int rb = 0; rb < RB; ++rb) {
            float mx[2] = {-INFINITY, -INFINITY};
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb)
                #pragma unroll
                for (int e = 0; e < 4; ++e) mx[e >> 1] = fmax(mx[e >> 1], s[rb][jb][e]);
            float alpha[2];
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                QUAD_MAX(mx[r]);
                mx[r] = fmax(m[rb][r], mx[r] * sc);
                // 1 while nothing is allowed yet (mx = -inf), else exp(m_old - m_new)
                alpha[r] = mx[r] == -INFINITY ? 1.0f : EXPF(m[rb][r] - mx[r]);
                m[rb][r] = mx[r];
                l[rb][r] *= alpha[r];
            }
            #pragma unroll
            for (int db = 0; db < DB; ++db) {
                o[rb][db][0] *= alpha[0]; o[rb][db][1] *= alpha[0];
                o[rb][db][2] *= alpha[1]; o[rb][db][3] *= alpha[1];
            }
            // p = exp(s - m) in place, the lane's share of the row sums, p (with dropout's multiplier) as A
            // fragments of p v
#if EXP_FUSED
            const float c = sc * LOG2E;
            const float mb[2] = {m[rb][0] == -INFINITY ? 0.0f : m[rb][0] * LOG2E,
                                 m[rb][1] == -INFINITY ? 0.0f : m[rb][1] * LOG2E};
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb)
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = EXP2F(fma(s[rb][jb][e], c, -mb[e >> 1]));
                    l[rb][e >> 1] += p;
                    s[rb][jb][e] = p;
                }
#else
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb)
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = s[rb][jb][e] == -INFINITY ? 0.0f : EXPF(s[rb][jb][e] - m[rb][e >> 1]);
                    l[rb][e >> 1] += p;
                    s[rb][jb][e] = p;
                }
#endif
            if (drop_threshold) DROP_ROWS(s[rb], s[rb], rloc[rb]);
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb) PACK_A(pa[rb], jb, s[rb][jb]);
        }
#if MMA_WG && WG_KN && HEAD_DIM == 128 && BN == 64
        // o += p v by 64-column halves: p from registers, each half of the v tile read MN-major, k = 64
#if KV_SPLIT
        CP_WAIT1();                     // v tile it has landed (k tile it + 1 may fly)
        FENCE_ASYNC();
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        WGR_TILE(o[0], pa[0], vsb, vat, DESC_MN, 1, 1);
        WGR_TILE((o[0] + 8), pa[0], vsb, vat + BN * WG_ROW, DESC_MN, 1, 1);
#if KV_SPLIT
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp's o += p v is done: the v buffer takes the next tile
        if (j0 + BN < jend) ISSUE_TILE(vsb, vb, v_ss, j0 + BN, BN, jend, tid);
        CP_COMMIT();
#endif
#elif MMA_WG && WG_KN && HEAD_DIM == 128
        // o += p v by 64-column halves: p from registers, each half of the v tile read MN-major
        WGR_TILE2(o[0], pa[0], vsb, vat, DESC_MN, 1, 1);
        WGR_TILE2((o[0] + 8), pa[0], vsb, vat + BN * WG_ROW, DESC_MN, 1, 1);
#elif MMA_WG && WG_KN
        WGR_TILE(o[0], pa[0], vsb, vat, DESC_MN, 1, 1);   // o += p v: p from registers, v read MN-major
#else
        // o += p v: each v fragment pair read once for the RB row blocks
        MMA_KN_RB(o, pa, BN / 16, VS_KN_T);
#endif
    }
#if KV_SPLIT
    CP_WAIT0();   // (a work-group whose rows see no key never waited for the tiles it issued)
#endif

    MMA_UNROLL
    for (int rb = 0; rb < RB; ++rb)
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            float lr = l[rb][r];
            QUAD_SUM(lr);
            if (i0 + rloc[rb][r] >= SQ) continue;
            const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
            __global uint *orow = (__global uint *)OUT_ROW(b, h, i0 + rloc[rb][r]);
            #pragma unroll
            for (int db = 0; db < DB; ++db)
                orow[db * 4 + t] = pack2(o[rb][db][2 * r] * inv, o[rb][db][2 * r + 1] * inv);
            if (t == 0) lse[row0 + rloc[rb][r]] = lr > 0.0f ? m[rb][r] + log(lr) : -INFINITY;
        }
}
#endif

// ---- the backward: two passes, no atomics (the same bits on every run) ------------------------------
// attention_backward_dq_mma: global (ceil(SQ / BM) * THREADS, HQ, B). delta = rowsum(dO * out) of the
//   work-group's BM query rows (written: the dk/dv pass reads it); then, when do_dq, q's and dO's fragments
//   in registers and per key tile (k and v in local memory): s = q k^T and dp = dO v^T, p = exp(s - lse),
//   ds = p (z dp - delta) rounded to T as the A operand of dq += ds k (k's fragments by ldmatrix.trans);
//   dq = scale dq stored in T.
// attention_backward_dkdv_mma: global (ceil(SK / BM) * THREADS, HKV, B). Warp w keeps keys j0 + 16 w .. + 15
//   of one kv head (k's and v's fragments in registers) and walks the query tiles of BQ rows of the GROUP
//   heads that can see them (q, dO tiles, lse, delta in local memory): s^T = k q^T and dp^T = v dO^T, p^T and
//   ds^T as above, dv += (p z)^T dO and dk += ds^T q (q's and dO's fragments by ldmatrix.trans); dk = scale
//   dk and dv stored in T. Local memory: 2 * max(BM, BQ, 2 * BQ with DKDV_RING) * (HEAD_DIM + 8) 16-bit values
//   and 2 * BQ floats (twice with DKDV_RING). MMA_WG (above): the products on the warpgroup units.
#ifndef BQ
#define BQ 32
#endif
#if BQ % 16
#error "attention_mma.cl: BQ a multiple of 16"
#endif
#define QB (BQ / 8)

// B operands of the backward's products, from rows of a local tile `tile` (addressing as Q_ROWS etc.):
// rows (the n side) at jb * 8 .. + 15, k step kk along the head dim; rows kk * 16 .. + 15 (the k side) at
// columns db * 8 .. + 15, transposed
#define NT_ROWS(tile, L) ((tile) + (jb * 8 + ((L) >> 4) * 8 + ((L) & 7)) * DPAD + kk * 16 + (((L) >> 3) & 1) * 8)
#define KN_ROWS(tile, L) ((tile) + (kk * 16 + (((L) >> 3) & 1) * 8 + ((L) & 7)) * DPAD                        \
                          + (KN_COL0 + db + ((L) >> 4)) * 8)
#define KN_COL0 0                // (the dk/dv pass: its slice's first column block)
#define WARP_ROWS(tile, L) ((tile) + (warp * 16 + ((L) & 15)) * DPAD + kk * 16 + ((L) >> 4) * 8)
// the dq pass's rows of a warp's row block rb
#define WARP_RB_ROWS(tile, L) ((tile) + (warp * WROWS + rb * 16 + ((L) & 15)) * DPAD + kk * 16 + ((L) >> 4) * 8)
#define KS_NT(L) NT_ROWS(ks, L)
#define VS_NT(L) NT_ROWS(vs, L)
#define KS_KN(L) KN_ROWS(ks, L)
#define QS_NT(L) NT_ROWS(qs, L)
#define GS_NT(L) NT_ROWS(gs, L)
#define QS_KN(L) KN_ROWS(qs, L)
#define GS_KN(L) KN_ROWS(gs, L)
#define KS_WARP(L) WARP_RB_ROWS(ks, L)
#define VS_WARP(L) WARP_RB_ROWS(vs, L)
#define QS_WARP(L) WARP_ROWS(qs, L)
#define GS_WARP(L) WARP_ROWS(gs, L)


// out_rows[c][db] (c < 2: rows g, g + 8 of the warp) = acc * mul, stored in T at row `row` of `base`
inline void store_rows2(__global T *base, const long row, const float acc[DB][4], const int r, const float mul,
                        const int t) {
    __global uint *dst = (__global uint *)(base + row * HEAD_DIM);
    #pragma unroll
    for (int db = 0; db < DB; ++db) dst[db * 4 + t] = pack2(acc[db][2 * r] * mul, acc[db][2 * r + 1] * mul);
}

// the same for a slice of DBS column blocks from block col0 (the dk/dv pass's DSPLIT)
inline void store_slice2(__global T *row, const float acc[DBS][4], const int r, const float mul, const int t,
                         const int col0) {
    __global uint *dst = (__global uint *)row + col0 * 4;
    #pragma unroll
    for (int db = 0; db < DBS; ++db) dst[db * 4 + t] = pack2(acc[db][2 * r] * mul, acc[db][2 * r + 1] * mul);
}

// the sum of the products of two rows of eight 16-bit values (T's bits) in float32
inline float bits16_lo(const uint w) {
#if defined(IS_BF16)
    return as_float(w << 16);
#else
    return nc_h2f((ushort)w);
#endif
}
inline float bits16_hi(const uint w) {
#if defined(IS_BF16)
    return as_float(w & 0xffff0000u);
#else
    return nc_h2f((ushort)(w >> 16));
#endif
}
inline float dot8_bits(const uint4 a, const uint4 o) {
    return bits16_lo(a.s0) * bits16_lo(o.s0) + bits16_hi(a.s0) * bits16_hi(o.s0)
         + bits16_lo(a.s1) * bits16_lo(o.s1) + bits16_hi(a.s1) * bits16_hi(o.s1)
         + bits16_lo(a.s2) * bits16_lo(o.s2) + bits16_hi(a.s2) * bits16_hi(o.s2)
         + bits16_lo(a.s3) * bits16_lo(o.s3) + bits16_hi(a.s3) * bits16_hi(o.s3);
}

#if MMA_PASS == 0 || MMA_PASS == 2
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_backward_dq_mma(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out), MASK_ARGS,
                               LEN_ARGS, __global const ACC *lse, __global ACC *delta, GRAD_ARGS(dq),
                               const int do_dq, const int HQ, const int GROUP, const int SQ, const int SK,
                               const int causal, const ACC scale, DROP_ARGS)
{
#if MMA_WG && HEAD_DIM == 128
    // the ring's two stages of 32-key k and v tiles or one of 64 keys (16 KB each), q's 64 rows (16 KB) as
    // the score product's A operand by descriptor (as the forward's); dO's rows pass through the k stages
    // (swizzled, 16 KB) into registers (dp's A operand), lse and delta through the v stages, before the ring
    // starts
    __local uint4 ks4[KV_STAGES * BN * HEAD_DIM / 8], vs4[KV_STAGES * BN * HEAD_DIM / 8], qw4[BM * HEAD_DIM / 8];
    __local float *const rowv = (__local float *)vs4;
#elif MMA_WG && WG_SS
#if BM != 64
#error "attention_mma.cl WG_SS: 64 query rows a work-group (one warpgroup: 48 KB of local memory)"
#endif
    __local uint4 ks4[2 * BN * WG_ROW / 16], vs4[2 * BN * WG_ROW / 16];   // the ring's k and v tiles
    __local uint4 qw4[BM * WG_ROW / 16], gw4[BM * WG_ROW / 16];           // q's and dO's rows: A operands
    __local float *const rowv = (__local float *)ks4;   // lse, then delta of the rows (before the ring)
#else
    __local uint4 ks4[KV_ROWS * DPAD / 8], vs4[KV_ROWS * DPAD / 8];
    __local float rowv[2 * BM];   // lse, then delta of the tile's rows
#endif
    __local ushort *const ksb = (__local ushort *)ks4, *const vsb = (__local ushort *)vs4;
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS * 16 * KSTEP], scratch_b[WARPS * KSTEP * 8], shx[THREADS];
#endif
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int i0 = get_group_id(0) * BM, h = get_global_id(1), b = get_global_id(2);
    if (i0 >= SQ) return;
    const long row0 = ((long)b * HQ + h) * SQ + i0;
    __global const T *const grow = grad_out + grad_out_off + b * grad_out_sb + h * grad_out_sh;
    __global const T *const orow = out + out_off + b * out_sb + h * out_sh;
#if (CH & (CH - 1)) == 0 && THREADS % CH == 0
    // a row's CH 16-byte chunks of dO and out over CH neighbouring work-items, their products summed by
    // shuffles (every work-item takes part in each: the loop's trip count is the same for all)
    for (int rb = 0; rb < BM; rb += THREADS / CH) {
        const int r = rb + tid / CH, c = tid % CH;
        float d = 0.0f;
        if (i0 + r < SQ)
            d = dot8_bits(*(__global const uint4 *)(grow + (long)(i0 + r) * grad_out_ss + c * 8),
                          *(__global const uint4 *)(orow + (long)(i0 + r) * out_ss + c * 8));
        #pragma unroll
        for (int m = 1; m < CH; m <<= 1) d += SHFL_XOR(d, m);
        if (c == 0) {
            if (i0 + r < SQ) delta[row0 + r] = d;
            rowv[BM + r] = d;
        }
    }
    for (int r = tid; r < BM; r += THREADS) rowv[r] = i0 + r < SQ ? lse[row0 + r] : INFINITY;
#else
    for (int r = tid; r < BM; r += THREADS) {
        float d = 0.0f;
        if (i0 + r < SQ) {
            for (int e = 0; e < HEAD_DIM; ++e)
                d += LOAD_T(grow, (i0 + r) * grad_out_ss + e) * LOAD_T(orow, (i0 + r) * out_ss + e);
            delta[row0 + r] = d;
        }
        rowv[r] = i0 + r < SQ ? lse[row0 + r] : INFINITY;
        rowv[BM + r] = d;
    }
#endif
    if (!do_dq) return;
    const int hk = h / GROUP;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jend = key_end(causal, min(i0 + BM, SQ) - 1, L, SQ);
    __global const ushort *const kb = (__global const ushort *)(k + k_off + b * k_sb + hk * k_sh);
    __global const ushort *const vb = (__global const ushort *)(v + v_off + b * v_sb + hk * v_sh);
    const long mbase = mask_off + b * mask_sb + h * mask_sh;
    int rloc[RB][2], irow[RB][2];
    #pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
        rloc[rb][0] = warp * WROWS + rb * 16 + g;
        rloc[rb][1] = rloc[rb][0] + 8;
        irow[rb][0] = min(i0 + rloc[rb][0], SQ - 1);
        irow[rb][1] = min(i0 + rloc[rb][1], SQ - 1);
    }

#if MMA_WG && HEAD_DIM == 128
    // q's rows into their buffer (landed by the wait below, fenced for the units by the ring's first), dO's
    // through the k stages into registers
    ISSUE_TILE((__local ushort *)qw4, (__global const ushort *)(q + q_off + b * q_sb + h * q_sh), q_ss, i0, BM, SQ,
               tid);
    ISSUE_TILE(ksb, (__global const ushort *)grow, grad_out_ss, i0, BM, SQ, tid);
    CP_COMMIT();
    CP_WAIT0();
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint qat = WG_BASE(qw4);
    uint ga[RB][DK][4];
    MMA_UNROLL
    for (int kk = 0; kk < DK; ++kk) LDSM(ga[0][kk], GW_ROWS, false);
#elif MMA_WG && WG_SS
    // (landed by the ring's first wait; the barrier: rowv's values for everyone, read below, before the ring's
    // first tile takes their memory)
    ISSUE_TILE((__local ushort *)qw4, (__global const ushort *)(q + q_off + b * q_sb + h * q_sh), q_ss, i0, BM, SQ,
               tid);
    ISSUE_TILE((__local ushort *)gw4, (__global const ushort *)grow, grad_out_ss, i0, BM, SQ, tid);
    CP_COMMIT();
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint qat = WG_BASE(qw4), gat = WG_BASE(gw4);
#else
    uint qa[RB][DK][4], ga[RB][DK][4];
    {
        __local ushort *const ks = ksb, *const vs = vsb;
        load_tile(ks, (__global const ushort *)(q + q_off + b * q_sb + h * q_sh), q_ss, i0, BM, SQ, tid);
        load_tile(vs, (__global const ushort *)grow, grad_out_ss, i0, BM, SQ, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        MMA_UNROLL
        for (int rb = 0; rb < RB; ++rb)
            MMA_UNROLL
            for (int kk = 0; kk < DK; ++kk) {
                LDSM(qa[rb][kk], KS_WARP, false);
                LDSM(ga[rb][kk], VS_WARP, false);
            }
    }
#endif
    float lse_r[RB][2], delta_r[RB][2];
    #pragma unroll
    for (int rb = 0; rb < RB; ++rb)
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            lse_r[rb][r] = rowv[rloc[rb][r]];
            delta_r[rb][r] = rowv[BM + rloc[rb][r]];
#if EXP_FUSED
            lse_r[rb][r] = lse_r[rb][r] == -INFINITY ? 0.0f : lse_r[rb][r] * LOG2E;   // in log2 units
#endif
        }
    float dqa[RB][DB][4];
    #pragma unroll
    for (int rb = 0; rb < RB; ++rb) ZERO_ACC(dqa[rb], DB);

#if KV_SPLIT   // (every warp has read dO's rows and lse, delta from the stages) the first v, then k tile
    barrier(CLK_LOCAL_MEM_FENCE);
    ISSUE_TILE(vsb, vb, v_ss, 0, BN, jend, tid);
    CP_COMMIT();
    ISSUE_TILE(ksb, kb, k_ss, 0, BN, jend, tid);
    CP_COMMIT();
#else
    STREAM_BEGIN(ksb, vsb, kb, k_ss, vb, v_ss, BN, jend);
#endif
    for (int j0 = 0, it = 0; j0 < jend; j0 += BN, ++it) {
#if KV_SPLIT
        CP_WAIT1();                     // this work-item's copies of v tile it have landed (k's may fly)
        FENCE_ASYNC();
        barrier(CLK_LOCAL_MEM_FENCE);   // ... and everyone's
#else
        STREAM_NEXT(ksb, vsb, kb, k_ss, vb, v_ss, BN, jend, ks, vs);
#endif
        float s[RB][NB][4], dp[RB][NB][4];
#if MMA_WG
        // (RB 1: s[0], dp[0] are the warpgroup's 64 x 64 accumulators; the first k step overwrites them)
        const uint kat = WG_BASE(ksb) + KV_STAGE(it) * TILE_ELEMS(BN) * 2;
        const uint vat = WG_BASE(vsb) + KV_STAGE(it) * TILE_ELEMS(BN) * 2;
#if HEAD_DIM == 128
        // s (m64n32 or m64n64) from q's rows in local memory, dp from dO's fragments; 8 k steps over both
        // halves
        WG_FRESH(gf, ga[0]);
        WG_FENCE();
#if KV_SPLIT   // dp's batch while k tile it lands, then s's; both waited for
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) WGR_S(dp[0], gf[kk], vsb, DESC_KMH(vat, kk, BN), kk > 0);
        WG_COMMIT();
        CP_WAIT0();
        FENCE_ASYNC();
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) WGS_S(s[0], qw4, DESC_KMH(qat, kk, BM), ksb, DESC_KMH(kat, kk, BN), kk > 0);
        WG_COMMIT();
        WG_WAIT_S2(s[0], dp[0]);
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp's dp is done: the v buffer takes the next tile
        if (j0 + BN < jend) ISSUE_TILE(vsb, vb, v_ss, j0 + BN, BN, jend, tid);
        CP_COMMIT();
#else
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            WGS_S(s[0], qw4, DESC_KMH(qat, kk, BM), ksb, DESC_KMH(kat, kk, BN), kk > 0);
            WGR_S(dp[0], gf[kk], vsb, DESC_KMH(vat, kk, BN), kk > 0);
        }
        WG_COMMIT();
        WG_WAIT_S2(s[0], dp[0]);
#endif
#else
#if WG_SS
        WG_FENCE();
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            WGS(s[0], qw4, DESC_KM(qat, kk), ksb, DESC_KM(kat, kk), kk > 0);
            WGS(dp[0], gw4, DESC_KM(gat, kk), vsb, DESC_KM(vat, kk), kk > 0);
        }
#else
#if WG_KN
        WG_FRESH(qf, qa[0]);
        WG_FRESH(gf, ga[0]);
#else
#define qf qa[0]
#define gf ga[0]
#endif
        WG_FENCE();
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            WGR(s[0], qf[kk], ksb, DESC_KM(kat, kk), kk > 0);
            WGR(dp[0], gf[kk], vsb, DESC_KM(vat, kk), kk > 0);
        }
#undef qf
#undef gf
#endif
        WG_COMMIT();
        WG_WAIT_ACC(s[0], dp[0]);
#endif
#else
        #pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
            ZERO_ACC(s[rb], NB);
            ZERO_ACC(dp[rb], NB);
        }
        MMA_NT_RB(s, qa, NB, KS_NT);
        MMA_NT_RB(dp, ga, NB, VS_NT);
#endif
        // p = exp(s - lse) in place (0 where masked), dp times dropout's multipliers, ds = p (dp - delta)
        const bool open = open_tile(j0, BN, i0, L, SQ, causal);
        uint da[RB][BN / 16][4];
        #pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
#if EXP_FUSED
            // p = exp2(s c - lse log2 e): c = scale log2 e on an unmasked tile, log2 e on a masked one (scaled
            // and masked first); lse_r is 0 where the row sees nothing (its scores are all -inf)
            float c = scale * LOG2E;
            if (!open) {
                SCALE_ACC(s[rb], NB, scale);
                MASK_ROWS(s[rb], irow[rb]);
                c = LOG2E;
            }
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb)
                #pragma unroll
                for (int e = 0; e < 4; ++e) s[rb][jb][e] = EXP2F(fma(s[rb][jb][e], c, -lse_r[rb][e >> 1]));
#else
            SCALE_ACC(s[rb], NB, scale);
            if (!open) MASK_ROWS(s[rb], irow[rb]);
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb)
                #pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[rb][jb][e] = s[rb][jb][e] == -INFINITY ? 0.0f : EXPF(s[rb][jb][e] - lse_r[rb][e >> 1]);
#endif
            if (drop_threshold) DROP_ROWS(dp[rb], s[rb], rloc[rb]);
            #pragma unroll
            for (int jb = 0; jb < NB; ++jb) {
                float ds[4];
                #pragma unroll
                for (int e = 0; e < 4; ++e) ds[e] = s[rb][jb][e] * (dp[rb][jb][e] - delta_r[rb][e >> 1]);
                PACK_A(da[rb], jb, ds);
            }
        }
#if MMA_WG && WG_KN && HEAD_DIM == 128 && BN == 64
        // dq += ds k by 64-column halves in one batch: ds from registers, each half of the k tile read
        // MN-major, k = 64
        WGR_TILE_HALVES(dqa[0], da[0], ksb, kat, kat + BN * WG_ROW, DESC_MN, 1);
#if KV_SPLIT
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp's dq += ds k is done: the k buffer takes the next tile
        if (j0 + BN < jend) ISSUE_TILE(ksb, kb, k_ss, j0 + BN, BN, jend, tid);
        CP_COMMIT();
#endif
#elif MMA_WG && WG_KN && HEAD_DIM == 128
        // dq += ds k by 64-column halves: ds from registers, each half of the k tile read MN-major
        WGR_TILE2(dqa[0], da[0], ksb, kat, DESC_MN, 1, 1);
        WGR_TILE2((dqa[0] + 8), da[0], ksb, kat + BN * WG_ROW, DESC_MN, 1, 1);
#elif MMA_WG && WG_KN
        WGR_TILE(dqa[0], da[0], ksb, kat, DESC_MN, 1, 1);   // dq += ds k: k read MN-major
#else
        MMA_KN_RB(dqa, da, BN / 16, KS_KN_T);
#endif
    }
#if KV_SPLIT
    CP_WAIT0();   // (as the forward's)
#endif
    #pragma unroll
    for (int rb = 0; rb < RB; ++rb)
        #pragma unroll
        for (int r = 0; r < 2; ++r)
            if (i0 + rloc[rb][r] < SQ) store_rows2(GRAD_ROW(dq, b, h, i0 + rloc[rb][r]), 0, dqa[rb], r, scale, t);
}
#endif

// DKDV_RING 1: the dk/dv pass's q and dO tiles (and their lse and delta) in a two-stage cp.async ring, tile
// n + 1 in flight while tile n is computed (the query tiles of all GROUP heads as one sequence); 0: each
// tile loaded by the work-items between two barriers
#ifndef DKDV_RING
#define DKDV_RING 0
#endif
// the ring's stages: 2; 1 (MMA_WG at head dim 128 with 32-row query tiles: k, v and one stage fill 48 KB)
// issues each tile once every warp is done with the last one and waits for it at once, the SM's other
// work-group computing meanwhile
#ifndef DKDV_STAGES
#define DKDV_STAGES 2
#endif
#if DKDV_STAGES != 2 && !(DKDV_STAGES == 1 && MMA_WG && WG_SS)
#error "attention_mma.cl DKDV_STAGES: 2, or 1 with MMA_WG and WG_SS"
#endif
#define QSTAGE(it) (DKDV_STAGES == 2 ? (it) & 1 : 0)   // the ring stage of query tile `it`
// rows of the dk/dv pass's two tiles: k's and v's KEYS rows first, then the query tiles (two stages with
// the ring)
#if (1 + DKDV_RING) * BQ > KEYS
#define QROWS ((1 + DKDV_RING) * BQ)
#else
#define QROWS KEYS
#endif

// this lane's 16 query columns' lse and delta (of query tile i0 of head h; rows past SQ: p = 0), with WG_SS
#define LSE_DELTA_COLS()                                                                                \
    float lse_c[QB][2], delta_c[QB][2];                                                                 \
    _Pragma("unroll")                                                                                   \
    for (int jb = 0; jb < QB; ++jb)                                                                     \
        _Pragma("unroll")                                                                               \
        for (int e = 0; e < 2; ++e) {                                                                   \
            const int c = i0 + jb * 8 + 2 * t + e;                                                      \
            lse_c[jb][e] = c < SQ ? lse[hrow0 + c] : INFINITY;                                          \
            delta_c[jb][e] = c < SQ ? delta[hrow0 + c] : 0.0f;                                          \
        }

// query tile `it` of the dk/dv pass's sequence (head gi = it / ntiles of the kv head's GROUP, rows istart +
// (it % ntiles) * BQ ..): its first row i0, head h, the rows' first index hrow0 in lse / delta
#define QTILE_AT(it)                                                                                    \
    const int gi_ = (it) / ntiles, i0 = istart + ((it) - gi_ * ntiles) * BQ, h = hk * GROUP + gi_;      \
    const long hrow0 = ((long)b * HQ + h) * SQ

#if MMA_PASS == 0 || MMA_PASS == 3
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void attention_backward_dkdv_mma(KV_ARGS(q), KV_ARGS(k), KV_ARGS(v), KV_ARGS(grad_out), KV_ARGS(out), MASK_ARGS,
                                 LEN_ARGS, __global const ACC *lse, __global const ACC *delta, GRAD_ARGS(dk),
                                 GRAD_ARGS(dv), const int HQ, const int GROUP, const int SQ, const int SK,
                                 const int causal, const ACC scale, DROP_ARGS)
{
#if MMA_WG && WG_SS
#if KEYS != 64
#error "attention_mma.cl WG_SS: 64 keys a work-group (one warpgroup: 48 KB of local memory)"
#endif
    // (head dim 128: 16-row query tiles in two stages or 32-row ones in one, each row two swizzled halves;
    // k, v and the ring 48 KB exactly)
    __local uint4 qs4[DKDV_STAGES * TILE_ELEMS(BQ) / 8], gs4[DKDV_STAGES * TILE_ELEMS(BQ) / 8];   // q's, dO's
#if DKDV_KREG
    __local uint4 vw4[TILE_ELEMS(KEYS) / 8];   // v's rows: dp^T's A operand (k's pass through the stages)
#else
    __local uint4 kw4[TILE_ELEMS(KEYS) / 8], vw4[TILE_ELEMS(KEYS) / 8];       // k's and v's rows: A operands
#endif
#define ROW_LSE(jb, e) lse_c[jb][(e) & 1]
#define ROW_DELTA(jb, e) delta_c[jb][(e) & 1]
#else
    __local uint4 qs4[QROWS * DPAD / 8], gs4[QROWS * DPAD / 8];   // (the k and v tiles first, then q and dO tiles)
    __local float rowvb[(1 + DKDV_RING) * 2 * BQ];   // lse, then delta of the query tile's rows (per stage)
#define ROW_LSE(jb, e) rowv[(jb) * 8 + 2 * t + ((e) & 1)]
#define ROW_DELTA(jb, e) rowv[BQ + (jb) * 8 + 2 * t + ((e) & 1)]
#endif
    __local ushort *const qsb = (__local ushort *)qs4, *const gsb = (__local ushort *)gs4;
#if MMA_WG
    const uint qbase = WG_BASE(qsb), gbase = WG_BASE(gsb);   // the stages' local addresses for the descriptors
#define QTILE_STAGE(buf, stage) ((buf) + (stage) * TILE_ELEMS(BQ))
#else
#define QTILE_STAGE(buf, stage) ((buf) + (stage) * BQ * DPAD)
#endif
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS * 16 * KSTEP], scratch_b[WARPS * KSTEP * 8], shx[THREADS];
#endif
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int j0 = get_group_id(0) / DSPLIT * KEYS, hk = get_global_id(1), b = get_global_id(2);
    const int dcol0 = get_group_id(0) % DSPLIT * DBS;   // this work-group's slice of dk's and dv's columns
#undef KN_COL0
#define KN_COL0 dcol0
    if (j0 >= SK) return;
    const int L = valid_keys(kv_len, kv_len_off, has_kv_len, kv_len_stride, b, SK);
    const int jloc[2] = {warp * 16 + g, warp * 16 + g + 8};

#if MMA_WG && WG_SS && DKDV_KREG
    // k's rows through the query stages (16 KB: both) into fragments before the ring takes them; v's rows
    // into their buffer
    ISSUE_TILE((__local ushort *)qs4, (__global const ushort *)(k + k_off + b * k_sb + hk * k_sh), k_ss, j0, KEYS,
               SK, tid);
    ISSUE_TILE((__local ushort *)vw4, (__global const ushort *)(v + v_off + b * v_sb + hk * v_sh), v_ss, j0, KEYS,
               SK, tid);
    CP_COMMIT();
    CP_WAIT0();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint ka[DK][4];
    MMA_UNROLL
    for (int kk = 0; kk < DK; ++kk) LDSM(ka[kk], KW_ROWS, false);
    barrier(CLK_LOCAL_MEM_FENCE);   // every warp has its fragments: the stages are free
    const uint vat = WG_BASE(vw4);
#elif MMA_WG && WG_SS
    // (landed by the ring's first wait: the same commit group as the first query tile)
    ISSUE_TILE((__local ushort *)kw4, (__global const ushort *)(k + k_off + b * k_sb + hk * k_sh), k_ss, j0, KEYS,
               SK, tid);
    ISSUE_TILE((__local ushort *)vw4, (__global const ushort *)(v + v_off + b * v_sb + hk * v_sh), v_ss, j0, KEYS,
               SK, tid);
    const uint kat = WG_BASE(kw4), vat = WG_BASE(vw4);
#else
    uint ka[DK][4], va[DK][4];
    {
        __local ushort *const qs = qsb, *const gs = gsb;
        load_tile(qs, (__global const ushort *)(k + k_off + b * k_sb + hk * k_sh), k_ss, j0, KEYS, SK, tid);
        load_tile(gs, (__global const ushort *)(v + v_off + b * v_sb + hk * v_sh), v_ss, j0, KEYS, SK, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        MMA_UNROLL
        for (int kk = 0; kk < DK; ++kk) {
            LDSM(ka[kk], QS_WARP, false);
            LDSM(va[kk], GS_WARP, false);
        }
    }
#endif
    float dka[DBS][4], dva[DBS][4];
    ZERO_ACC(dka, DBS);
    ZERO_ACC(dva, DBS);

    // the query tiles of every head of the group as one sequence of GROUP * ntiles
    const int istart = query_start(causal, j0, L, SQ, BQ), ntiles = query_tiles(istart, j0, L, SQ, BQ);
    const int total = GROUP * ntiles;
    __global const ushort *const qhead = (__global const ushort *)(q + q_off + b * q_sb);
    __global const ushort *const ghead = (__global const ushort *)(grad_out + grad_out_off + b * grad_out_sb);
#if DKDV_RING
    // rows past SQ are zero-filled: q and dO rows of zeros add nothing to dk and dv whatever their p
    #define ISSUE_QTILE(it, stage)                                                                      \
        do {                                                                                            \
            QTILE_AT(it);                                                                               \
            ISSUE_TILE(QTILE_STAGE(qsb, stage), qhead + h * q_sh, q_ss, i0, BQ, SQ, tid);               \
            ISSUE_TILE(QTILE_STAGE(gsb, stage), ghead + h * grad_out_sh, grad_out_ss, i0, BQ, SQ, tid); \
            ISSUE_ROWV(stage);                                                                          \
        } while (0)
#if MMA_WG && WG_SS
    #define ISSUE_ROWV(stage)
#else
    #define ISSUE_ROWV(stage)                                                                           \
        for (int r = tid; r < BQ; r += THREADS) {                                                       \
            const bool in = i0 + r < SQ;                                                                \
            nc_cp_async4(rowvb + (stage) * 2 * BQ + r, lse + (in ? hrow0 + i0 + r : 0), in ? 4 : 0);    \
            nc_cp_async4(rowvb + (stage) * 2 * BQ + BQ + r, delta + (in ? hrow0 + i0 + r : 0), in ? 4 : 0); \
        }
#endif
#if !(MMA_WG && WG_SS)
    barrier(CLK_LOCAL_MEM_FENCE);   // k's and v's fragments are read: the tiles' memory is free
#endif
#if DKDV_STAGES == 2
    if (total > 0) ISSUE_QTILE(0, 0);
#endif
    CP_COMMIT();
#endif
    for (int it = 0; it < total; ++it) {
        QTILE_AT(it);
        const long mbase = mask_off + b * mask_sb + h * mask_sh;
#if DKDV_RING
        __local ushort *const qs = QTILE_STAGE(qsb, QSTAGE(it)), *const gs = QTILE_STAGE(gsb, QSTAGE(it));
#if !(MMA_WG && WG_SS)
        __local float *const rowv = rowvb + (it & 1) * 2 * BQ;
#endif
        barrier(CLK_LOCAL_MEM_FENCE);   // every warp is done with tile it - 1: its stage is free
#if DKDV_STAGES == 2
        if (it + 1 < total) ISSUE_QTILE(it + 1, (it + 1) & 1);
        CP_COMMIT();
        CP_WAIT1();                     // this work-item's copies of tile it have landed
#else
        ISSUE_QTILE(it, 0);
        CP_COMMIT();
        LSE_DELTA_COLS();               // (read while the tile is in flight)
        CP_WAIT0();                     // this work-item's copies of tile it have landed
#endif
        STREAM_FENCE();                 // (MMA_WG: ... and are visible to the matrix units)
        barrier(CLK_LOCAL_MEM_FENCE);   // ... and everyone's
#else
        __local ushort *const qs = qsb, *const gs = gsb;
        __local float *const rowv = rowvb;
        barrier(CLK_LOCAL_MEM_FENCE);
        load_tile(qs, qhead + h * q_sh, q_ss, i0, BQ, SQ, tid);
        load_tile(gs, ghead + h * grad_out_sh, grad_out_ss, i0, BQ, SQ, tid);
        for (int r = tid; r < BQ; r += THREADS) {
            const bool in = i0 + r < SQ;
            rowv[r] = in ? lse[hrow0 + i0 + r] : INFINITY;   // rows past SQ: p = 0
            rowv[BQ + r] = in ? delta[hrow0 + i0 + r] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        float st[QB][4], dpt[QB][4];
#if MMA_WG
        // (the first k step overwrites the accumulators: no register writes between the fence and the units)
        const uint qat = qbase + QSTAGE(it) * TILE_ELEMS(BQ) * 2, gat = gbase + QSTAGE(it) * TILE_ELEMS(BQ) * 2;
#if WG_SS
#if DKDV_STAGES == 2
        LSE_DELTA_COLS();   // (read while the units work)
#endif
#if DKDV_KREG
        WG_FRESH(kf, ka);
#endif
        WG_FENCE();
#if WG_OVERLAP   // s^T's batch, then dp^T's (waited for below), m64n32, 8 k steps over both halves of the rows
#if DKDV_KREG
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) WGR32(st, kf[kk], qsb, DESC_KMH(qat, kk, BQ), kk > 0);
#else
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) WGS32(st, kw4, DESC_KMH(kat, kk, KEYS), qsb, DESC_KMH(qat, kk, BQ), kk > 0);
#endif
        WG_COMMIT();
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) WGS32(dpt, vw4, DESC_KMH(vat, kk, KEYS), gsb, DESC_KMH(gat, kk, BQ), kk > 0);
#elif HEAD_DIM == 128   // the same as m64n16
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            WGS16(st, kw4, DESC_KMH(kat, kk, KEYS), qsb, DESC_KMH(qat, kk, BQ), kk > 0);
            WGS16(dpt, vw4, DESC_KMH(vat, kk, KEYS), gsb, DESC_KMH(gat, kk, BQ), kk > 0);
        }
#else
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            WGS(st, kw4, DESC_KM(kat, kk), qsb, DESC_KM(qat, kk), kk > 0);
            WGS(dpt, vw4, DESC_KM(vat, kk), gsb, DESC_KM(gat, kk), kk > 0);
        }
#endif
#else
#if WG_KN
        WG_FRESH(kf, ka);
        WG_FRESH(vf, va);
#else
#define kf ka
#define vf va
#endif
        WG_FENCE();
        #pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            WGR(st, kf[kk], qsb, DESC_KM(qat, kk), kk > 0);
            WGR(dpt, vf[kk], gsb, DESC_KM(gat, kk), kk > 0);
        }
#undef kf
#undef vf
#endif
        WG_COMMIT();
#if WG_OVERLAP
        WG_WAIT1_ACC16(st);   // (dp^T's products still running)
#elif HEAD_DIM == 128
        WG_WAIT_ACC8X2(st, dpt);
#else
        WG_WAIT_ACC(st, dpt);
#endif
#else
        ZERO_ACC(st, QB);
        ZERO_ACC(dpt, QB);
        MMA_NT(st, ka, QB, QS_NT);
        MMA_NT(dpt, va, QB, GS_NT);
#endif
        // p^T = exp(s^T - lse) in place (0 where masked); ds^T = p^T (z dp^T - delta) in dpt's place and
        // p^T z in st's (z: dropout's multiplier, 1 without)
        SCALE_ACC(st, QB, scale);
        if (!open_tile(j0, KEYS, i0, L, SQ, causal)) {
            MASK_COLS(st, QB);
        }
        #pragma unroll
        for (int jb = 0; jb < QB; ++jb)
            #pragma unroll
            for (int e = 0; e < 4; ++e) st[jb][e] = st[jb][e] == -INFINITY ? 0.0f : EXPF(st[jb][e] - ROW_LSE(jb, e));
        if (drop_threshold) {
#if MMA_WG && WG_OVERLAP
            WG_WAIT_ACC16(dpt);   // (dropout's multipliers go into both)
#endif
            #pragma unroll
            for (int jb = 0; jb < QB; ++jb)
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = jb * 8 + 2 * t + (e & 1);
                    const float p = st[jb][e];
                    const float z = p == 0.0f ? 1.0f : dropout_one(counter0, hrow0 + i0 + c, j0 + jloc[e >> 1],
                                                                   seed_lo, seed_hi, drop_threshold, drop_scale);
                    dpt[jb][e] = p * (z * dpt[jb][e] - ROW_DELTA(jb, e));
                    st[jb][e] = p * z;
                }
        }
        // ds^T = p^T (dp^T - delta) in dpt's place, without dropout (WG_OVERLAP: below, dv's products running)
#define DS_T()                                                                                          \
    _Pragma("unroll")                                                                                   \
    for (int jb = 0; jb < QB; ++jb)                                                                     \
        _Pragma("unroll")                                                                               \
        for (int e = 0; e < 4; ++e) dpt[jb][e] = st[jb][e] * (dpt[jb][e] - ROW_DELTA(jb, e))
#if !(MMA_WG && WG_OVERLAP)
        else {
            DS_T();
        }
#endif
#if MMA_WG && WG_OVERLAP
        // dv += (p z)^T dO, dk += ds^T q by 64-column halves, the 32-row tiles read MN-major, two k steps: dv's
        // issued first (running while ds^T is formed), then dk's; both waited for at once
        uint pa[BQ / 16][4], da[BQ / 16][4];
        #pragma unroll
        for (int jb = 0; jb < QB; ++jb) PACK_A(pa, jb, st[jb]);
        WGR_HALVES2_ASYNC(dva, pa, gsb, DESC_MN(gat, 0), DESC_MN(gat, 1), DESC_MN(gat + BQ * WG_ROW, 0),
                          DESC_MN(gat + BQ * WG_ROW, 1), 1);
        WG_WAIT1_ACC16(dpt);   // dp^T's batch (dv's may still run)
        if (!drop_threshold) {
            DS_T();
        }
        #pragma unroll
        for (int jb = 0; jb < QB; ++jb) PACK_A(da, jb, dpt[jb]);
        WGR_HALVES2_ASYNC(dka, da, qsb, DESC_MN(qat, 0), DESC_MN(qat, 1), DESC_MN(qat + BQ * WG_ROW, 0),
                          DESC_MN(qat + BQ * WG_ROW, 1), 1);
        WG_WAIT_HALVES2(dka, dva);
#else
        uint pa[BQ / 16][4], da[BQ / 16][4];
        #pragma unroll
        for (int jb = 0; jb < QB; ++jb) {
            PACK_A(pa, jb, st[jb]);
            PACK_A(da, jb, dpt[jb]);
        }
#if MMA_WG && WG_KN && HEAD_DIM == 128
        // dv += (p z)^T dO, dk += ds^T q by 64-column halves: the 16-row tiles read MN-major
        WGR_HALVES1(dva, pa, gsb, DESC_MN(gat, 0), DESC_MN(gat + BQ * WG_ROW, 0), 1);
        WGR_HALVES1(dka, da, qsb, DESC_MN(qat, 0), DESC_MN(qat + BQ * WG_ROW, 0), 1);
#elif MMA_WG && WG_KN
        WGR_TILE(dva, pa, gsb, gat, DESC_MN, 1, 1);   // dv += (p z)^T dO, dk += ds^T q: the tiles read MN-major
        WGR_TILE(dka, da, qsb, qat, DESC_MN, 1, 1);
#else
        MMA_KN_SLICE(dva, pa, BQ / 16, GS_KN_T);
        MMA_KN_SLICE(dka, da, BQ / 16, QS_KN_T);
#endif
#endif
    }
    #pragma unroll
    for (int r = 0; r < 2; ++r)
        if (j0 + jloc[r] < SK) {
            store_slice2(GRAD_ROW(dk, b, hk, j0 + jloc[r]), dka, r, scale, t, dcol0);
            store_slice2(GRAD_ROW(dv, b, hk, j0 + jloc[r]), dva, r, 1.0f, t, dcol0);
        }
#undef KN_COL0
#define KN_COL0 0
}
#endif
