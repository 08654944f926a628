// Next-token sampling from a row of logits per batch element, on the device (a recorded decode step then
// needs no host work but reading the tokens).
//   SAMPLE_GREEDY: the index of the largest logit (the first on ties; -0.0 equals 0.0; NaN is the largest,
//     as in torch.argmax).
//   SAMPLE_RANDOM: z = logit / temperature; keep the top_k largest z (0: all; ties at the k-th value all
//     kept, as Hugging Face's TopKLogitsWarper), then the smallest set of the largest kept z whose softmax
//     mass reaches top_p (>= 1: all; Hugging Face's TopPLogitsWarper, ties kept); draw from the softmax
//     of the kept z by the Gumbel-max trick: argmax of z - log(-log(u)) over the kept tokens, u the
//     row's uniforms in [0, 1): the given ones (`given`), else drawn here, element row * vocab + j of the
//     (rows, vocab) float32 draw netcl.ops.random.rand makes from (seed, counter0): Philox block
//     counter0 + n / 4, word n % 4, 24 bits (random.cl's philox_fill), the same numbers without that launch,
//     and only for the tokens that need one. A token whose value cannot reach the best one a work-item
//     holds is skipped before its draw and logarithms: z + 16.75 below it (u < 1 puts -log(-log(u)) at most
//     16.64, and rounding is monotone, so the value rounds no higher than z + 16.75 does). Both argmaxes
//     order values as greedy's (argmax_key).
//   Both thresholds are found exactly on an order-preserving integer key of z (no sort): top_k's by a
//   radix select over the key's 4 bytes (4 counting passes over the row), top_p's by bisection over its
//   32 bits taken 4 at a time (8 mass passes of 15 candidates each; exp(z - max) of each kept token is
//   stored once in `scratch`, or, after top_k, beside its z in a local list of the kept tokens that the
//   passes visit instead of the row).
// Layout: SPLIT work-groups of WG work-items per row (global WG * rows * SPLIT); each work-item strides over
// its work-group's slice of the vocabulary (all of it where SPLIT is 1), then a tree reduction in local
// memory; with SPLIT > 1 (greedy and the draw without top_k or top_p only: the filtered modes' thresholds
// are the whole row's) each work-group stores its pick as (key, index) bits in parts (rows, SPLIT, 2) and the
// last of the row to arrive (arrivals[row], common.cl's nc_group_last_arrival) writes the best. CPUs use
// WG = 1 (one row per work-item, no barrier work); GPUs 256, and greedy rows up to 1,024; the random draw's
// work-items take Philox blocks (4 tokens each) in turn. Reads logits (row stride any, elements contiguous),
// uniforms (rows, vocab) contiguous where given; writes scratch (top_p only) and out[out_off + row *
// out_stride] (int); then, for a decode step's next input (next_input), the token's row of `table` into
// `next` and the row's position advanced, by the work-group that knows the token.
// Build options: T, ACC, IS_HALF, IS_BF16 (common.cl; float16, bfloat16 or float32 logits, read with
//   LOAD_T), -DMODE=SAMPLE_GREEDY|SAMPLE_RANDOM, -DWG=<power of two, the work-group size it requires>,
//   -DGREEDY_UNROLL=<loads (16-byte chunks where the row starts on 16 bytes) in flight a work-item, greedy>,
//   -DSPLIT=<work-groups a row, default 1>, -DNEXT_T=<uint, ushort or uchar: next_input's copy words>.

#include "common.cl"
#include "philox.cl"

#ifndef SPLIT
#define SPLIT 1
#endif
#ifndef NEXT_T
#define NEXT_T uint   // the words next_input copies an embedding row in (uint, ushort or uchar)
#endif
#ifndef KEPT_MAX
#define KEPT_MAX 1024   // top_p after top_k: the kept tokens a row's work-group lists at most
#endif

#define SAMPLE_GREEDY 1
#define SAMPLE_RANDOM 2
#if MODE != SAMPLE_GREEDY && WG > 512
#error "sampling.cl: the random modes take at most 512 work-items a row (top_p: 15 masses an item, local)"
#endif

// an unsigned key with key(a) < key(b) exactly when a < b (for non-NaN floats)
inline uint order_key(float f) {
    const uint bits = as_uint(f);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

inline float group_sum(float v, __local float *buf) {
    const int l = get_local_id(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] += buf[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// group_sum of 15 values a work-item at once, into v (every work-item gets the sums): each one's additions
// those of a group_sum of its own
inline void group_sums15(float *v, __local float *buf) {
    const int l = get_local_id(0);
    for (int c = 0; c < 15; ++c) buf[c * WG + l] = v[c];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s)
            for (int c = 0; c < 15; ++c) buf[c * WG + l] += buf[c * WG + l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int c = 0; c < 15; ++c) v[c] = buf[c * WG];
    barrier(CLK_LOCAL_MEM_FENCE);
}

inline float group_max(float v, __local float *buf) {
    const int l = get_local_id(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] = fmax(buf[l], buf[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// the order the argmax of both modes takes its values in: a float's order_key, with -0.0 equal to 0.0 and NaN
// above everything (the first NaN wins, as torch.argmax's)
inline uint argmax_key(float v) {
    return isnan(v) ? 0xFFFFFFFFu : order_key(v == 0.0f ? 0.0f : v);
}

// the work-group's argmax of (argmax_key, index) pairs: the largest key, then the smallest index; index -1
// (nothing yet) loses
inline int group_argmax(uint k, int i, __local uint *keys, __local int *idx) {
    const int l = get_local_id(0);
    keys[l] = k;
    idx[l] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WG / 2; w > 0; w >>= 1) {
        if (l < w) {
            const uint ko = keys[l + w];
            const int io = idx[l + w];
            if (io >= 0 && (idx[l] < 0 || ko > keys[l] || (ko == keys[l] && io < idx[l]))) {
                keys[l] = ko;
                idx[l] = io;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int r = idx[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// A row's 16-byte chunk: CHUNK values of T (float: 4; float16 and bfloat16: 8), element e into v[e]
#if defined(IS_HALF) || defined(IS_BF16)
#define CHUNK 8
#else
#define CHUNK 4
#endif
inline void chunk_values(const uint4 r, float *v)
{
    const uint w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if defined(IS_BF16)
        v[2 * i] = as_float(w[i] << 16);
        v[2 * i + 1] = as_float(w[i] & 0xFFFF0000u);
#elif defined(IS_HALF)
        v[2 * i] = nc_h2f((ushort)(w[i] & 0xFFFFu));
        v[2 * i + 1] = nc_h2f((ushort)(w[i] >> 16));
#else
        v[i] = as_float(w[i]);
#endif
    }
}

// The index of the row's largest logit (greedy's token; argmax_key's order), for the work-group: where the
// row starts on 16 bytes (a decode step's logits do) a work-item reads it in 16-byte chunks, GREEDY_UNROLL
// chunks in flight before any is compared (a row is one work-group's: on a GPU its loads are the launch's
// latency), then the rest element by element (all of it where the row does not start on 16 bytes); a
// work-item visits its tokens in index order, so the first of equal values wins
inline int row_argmax(__global const T *logits, const long base, const int vocab, __local uint *keys,
                      __local int *idx)
{
    const int l = get_local_id(0);
    uint best = 0u;
    int best_i = -1;
    __global const uint4 *c = (__global const uint4 *)(logits + base);
    const int chunks = ((ulong)c & 15) == 0 ? vocab / CHUNK : 0;
    for (int c0 = l; c0 < chunks; c0 += WG * GREEDY_UNROLL) {
        uint4 raw[GREEDY_UNROLL];
#pragma unroll
        for (int u = 0; u < GREEDY_UNROLL; ++u)
            raw[u] = c0 + u * WG < chunks ? c[c0 + u * WG] : (uint4)0u;
#pragma unroll
        for (int u = 0; u < GREEDY_UNROLL; ++u) {
            if (c0 + u * WG >= chunks) continue;
            float v[CHUNK];
            chunk_values(raw[u], v);
#pragma unroll
            for (int e = 0; e < CHUNK; ++e) {
                const uint key = argmax_key(v[e]);
                if (best_i < 0 || key > best) { best = key; best_i = (c0 + u * WG) * CHUNK + e; }
            }
        }
    }
    for (int j0 = chunks * CHUNK + l; j0 < vocab; j0 += WG * GREEDY_UNROLL) {
        float v[GREEDY_UNROLL];
#pragma unroll
        for (int u = 0; u < GREEDY_UNROLL; ++u)
            v[u] = j0 + u * WG < vocab ? LOAD_T(logits, base + j0 + u * WG) : 0.0f;
#pragma unroll
        for (int u = 0; u < GREEDY_UNROLL; ++u) {
            const uint key = argmax_key(v[u]);
            const int j = j0 + u * WG;
            if (j < vocab && (best_i < 0 || key > best)) { best = key; best_i = j; }
        }
    }
    return group_argmax(best, best_i, keys, idx);
}

// Block b of the (rows, vocab) float32 draw rand() makes from (seed, counter0): philox_block(counter0 + b)
// (random.cl's philox_fill, 4 elements a work-item); element n is word n % 4 of block n / 4, 24 bits
// (draw_word)
inline uint4 draw_block(const long b, const uint seed_lo, const uint seed_hi, const ulong counter0)
{
    return philox_block(counter0 + (ulong)b, seed_lo, seed_hi);
}

inline float draw_word(const uint4 w, const int k)
{
    return u24(k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w);
}

// The next decode step's input, made by the work-group that knows the row's token (netcl.ops.sample's embed
// and advance): row `row` of `next` (next_units words NEXT_T a row) = row `token` of `table` (its embedding,
// a plain copy of its bits; next_units 0: none), and position[row] += advance (0: none)
inline void next_input(const int token, const long row, __global const NEXT_T *table, const long table_off,
                       __global NEXT_T *next, const long next_off, const int next_units,
                       __global int *position, const long position_off, const long position_stride,
                       const int advance)
{
    const int l = get_local_id(0);
    if (token >= 0)
        for (int i = l; i < next_units; i += WG)
            next[next_off + row * next_units + i] = table[table_off + (long)token * next_units + i];
    if (l == 0 && advance != 0) position[position_off + row * position_stride] += advance;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void sample_tokens(__global const T *logits, const long logits_off, const long row_stride, const int vocab,
                   __global const float *uniforms, const int given, const uint seed_lo, const uint seed_hi,
                   const ulong counter0, __global float *scratch, __global int *out, const long out_off,
                   const long out_stride, const float inv_temperature, const int top_k, const float top_p,
                   __global int *arrivals, __global float *parts, __global const NEXT_T *table,
                   const long table_off, __global NEXT_T *next, const long next_off, const int next_units,
                   __global int *position, const long position_off, const long position_stride,
                   const int advance)
{
    __local float fbuf[WG];
    __local int ibuf[WG];
    __local uint ubuf[WG];
#if MODE != SAMPLE_GREEDY
    __local uint hist[256];   // top_k's radix select: the counts of one byte's values
    __local uint pick[2];     // its byte and the keys above the prefix, from work-item 0
    __local float mbuf[15 * WG];   // top_p: the masses of a pass's 15 candidates (15 KB at WG 256)
    __local float kz[KEPT_MAX], ke[KEPT_MAX];   // top_p after top_k: the kept tokens' z and exp(z - max)
#endif
#if SPLIT > 1
    __local int last;
#endif
    const long row = get_group_id(0) / SPLIT;
    const int l = get_local_id(0);
    const long base = logits_off + row * row_stride;
    // this work-group's tokens of the row: [lo, hi), SPLIT slices of a multiple of 8 tokens (16-byte chunks
    // stay on 16 bytes), the last ones possibly empty
    const int part = (int)(get_group_id(0) % SPLIT), per = ((vocab + SPLIT - 1) / SPLIT + 7) & ~7;
    const int lo = min(part * per, vocab), hi = min(lo + per, vocab);
#if MODE == SAMPLE_GREEDY
    const int found = row_argmax(logits, base + lo, hi - lo, ubuf, ibuf);
    const int token = found < 0 ? -1 : lo + found;
#else
    // top_k: keep_from = the largest key t with count(key >= t) >= top_k, the k-th largest key, by a radix
    // select over the key's bytes, high to low: 4 passes over the row (a bisection over its bits took 32).
    // A pass counts the keys on the prefix found so far by their next byte (`hist`); the largest byte whose
    // count, with the keys above it and `above` (the keys above the prefix), reaches top_k extends it.
    uint keep_from = 0u;
    if (top_k > 0 && top_k < vocab) {
        uint above = 0u;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = l; b < 256; b += WG) hist[b] = 0u;
            barrier(CLK_LOCAL_MEM_FENCE);
            const uint high = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);   // the bytes found so far
            for (int j = l; j < vocab; j += WG) {
                const uint key = order_key(LOAD_T(logits, base + j) * inv_temperature);
#if WG == 1
                if ((key & high) == keep_from) ++hist[(key >> shift) & 255u];
#else
                if ((key & high) == keep_from) atomic_inc(&hist[(key >> shift) & 255u]);
#endif
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (l == 0) {   // the keys on the prefix reach top_k with `above`: some byte d >= 0 does
                uint n = above;
                int d = 255;
                for (; d > 0 && n + hist[d] < (uint)top_k; --d) n += hist[d];
                pick[0] = (uint)d;
                pick[1] = n;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            keep_from |= pick[0] << shift;
            above = pick[1];
            barrier(CLK_LOCAL_MEM_FENCE);   // every item has read pick before hist and pick are written again
        }
    }
    // top_p: the largest key t whose kept mass sum(exp(z - max) over key >= t) reaches top_p of the total.
    // With top_k on, each work-item's kept tokens (key >= keep_from) go first to local memory, in its index
    // order at its own place (a count, a scan, a copy; KEPT_MAX at most, else the row as below), and the
    // passes visit only those: a token not kept adds exp's 0 to nothing, so every sum is the same to the last
    // bit, and the max is the row's (top_k keeps the largest z; fmax passes NaN by)
    if (top_p < 1.0f) {
        int mine = (vocab - l + WG - 1) / WG, at = 0;   // this work-item's tokens; at: its first kept slot
        int listed = 0;
        if (keep_from > 0u) {
            int own = 0;
            for (int j = l; j < vocab; j += WG) own += order_key(LOAD_T(logits, base + j) * inv_temperature)
                                                      >= keep_from;
            ibuf[l] = own;   // an inclusive scan of the counts (Hillis-Steele)
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int off = 1; off < WG; off <<= 1) {
                const int add = l >= off ? ibuf[l - off] : 0;
                barrier(CLK_LOCAL_MEM_FENCE);
                ibuf[l] += add;
                barrier(CLK_LOCAL_MEM_FENCE);
            }
            listed = ibuf[WG - 1] <= KEPT_MAX;
            at = ibuf[l] - own;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (listed) {
                int n = at;
                for (int j = l; j < vocab; j += WG) {
                    const float z = LOAD_T(logits, base + j) * inv_temperature;
                    if (order_key(z) >= keep_from) kz[n++] = z;
                }
                mine = own;
            }
        }
        float m = -INFINITY;
        for (int i = 0; i < mine; ++i)
            m = fmax(m, listed ? kz[at + i] : LOAD_T(logits, base + l + i * WG) * inv_temperature);
        m = group_max(m, fbuf);
        __global float *e = scratch + row * (long)vocab;
        float part = 0.0f;
        for (int i = 0; i < mine; ++i) {
            const float z = listed ? kz[at + i] : LOAD_T(logits, base + l + i * WG) * inv_temperature;
            const float w = order_key(z) >= keep_from ? exp(z - m) : 0.0f;
            if (listed) ke[at + i] = w;
            else e[l + i * WG] = w;
            part += w;
        }
        const float goal = top_p * group_sum(part, fbuf);
        // t is found 4 bits a pass (8 passes over the row): a pass sums the mass of each of the 15 candidates
        // t | c << shift (c = 1..15) at once, each as a bisection step would (a work-item's own tokens in
        // index order, then group_sum's tree), and takes the largest c whose mass reaches the goal: the
        // masses fall as c grows (nested sets summed in one order), so the bisection's 4 steps over these
        // bits would take the same c, and t is the same to the last bit
        uint t = 0u;
        for (int shift = 28; shift >= 0; shift -= 4) {
            float mass[15];
            for (int c = 0; c < 15; ++c) mass[c] = 0.0f;
            const uint high = shift == 28 ? 0u : 0xFFFFFFFFu << (shift + 4);   // the bits found so far
            for (int i = 0; i < mine; ++i) {
                const uint key = order_key(listed ? kz[at + i]
                                                  : LOAD_T(logits, base + l + i * WG) * inv_temperature);
                if ((key & high) < t) continue;
                // key >= t | c << shift exactly for c <= d (every c where the found bits are exceeded)
                const uint d = (key & high) > t ? 15u : (key >> shift) & 15u;
                const float w = listed ? ke[at + i] : e[l + i * WG];
                for (int c = 0; c < 15; ++c)
                    if ((uint)c < d) mass[c] += w;
            }
            group_sums15(mass, mbuf);
            uint c = 15u;
            while (c > 0u && !(mass[c - 1u] >= goal)) --c;
            t |= c << shift;
        }
        keep_from = max(keep_from, t);
    }
    uint best = 0u;
    int best_i = -1;
    const long first = row * (long)vocab;   // the row's first element of the (rows, vocab) draw
    __global const float *u = uniforms + first;
    // floor: a value the draw's winner reaches (the largest value a work-item has met; where a row is a
    // work-group's and no top_k bounds the tokens kept, from the start the most likely token's own, which
    // top_p always keeps: else a work-item's tokens would be drawn until it met a large value itself); a
    // token below it is skipped
    float floor_v = -INFINITY;
#if WG > 1
    if ((top_k == 0 || top_k >= vocab) && lo < hi) {   // (a slice's own most likely token does as well)
        const int top = lo + row_argmax(logits, base + lo, hi - lo, ubuf, ibuf);
        floor_v = LOAD_T(logits, base + top) * inv_temperature
                - log(-log(given ? u[top]
                                 : draw_word(draw_block((first + top) >> 2, seed_lo, seed_hi, counter0),
                                             (int)((first + top) & 3))));
    }
#endif
    // the Philox blocks of the slice's tokens, (first + lo) >> 2 .. (first + hi - 1) >> 2, taken in turn by
    // the work-items (each visits its tokens in index order: the first of equal values wins, as everywhere
    // here); a block across two slices is drawn by both, each taking its own tokens
    const long b0 = (first + lo) >> 2, blocks = lo < hi ? ((first + hi - 1) >> 2) - b0 + 1 : 0;
    for (long bk = l; bk < blocks; bk += WG) {
        uint4 words = (uint4)0u;
        int drawn = 0;
        for (int w = 0; w < 4; ++w) {
            const long j = 4 * (b0 + bk) + w - first;
            if (j < lo || j >= hi) continue;
            const float z = LOAD_T(logits, base + j) * inv_temperature;
            if (order_key(z) < keep_from) continue;
            const float uj = given ? u[j] : 0.0f;
            if ((!given || uj < 1.0f) && z + 16.75f < floor_v) continue;
            if (!given && !drawn) {   // (the block's words once, for its first token that needs one)
                words = draw_block(b0 + bk, seed_lo, seed_hi, counter0);
                drawn = 1;
            }
            const float v = z - log(-log(given ? uj : draw_word(words, w)));
            const uint key = argmax_key(v);
            if (best_i < 0 || key > best) { best = key; best_i = (int)j; floor_v = fmax(floor_v, v); }
        }
    }
    const int token = group_argmax(best, best_i, ubuf, ibuf);
#endif
#if SPLIT > 1
    // the slices' best (key, index) pairs: the last work-group of the row to finish takes the largest key,
    // the smallest index among equal ones (a slice with none: index -1, it loses)
    __global float *mine = parts + 2 * (row * SPLIT + part);
    if (l == 0) {
        PART_STORE(mine, 0, as_float(token < 0 ? 0u : ubuf[0]));   // (ubuf[0]: group_argmax's key)
        PART_STORE(mine, 1, as_float(token));
    }
    if (nc_group_last_arrival(arrivals + row, SPLIT, &last)) {
        // (every work-item merges the same parts: each then has the token for the next input's copy)
        uint bk = 0u;
        int bi = -1;
        for (int q = 0; q < SPLIT; ++q) {
            const uint k = as_uint(PART_LOAD(parts, 2 * (row * SPLIT + q)));
            const int i = as_int(PART_LOAD(parts, 2 * (row * SPLIT + q) + 1));
            if (i >= 0 && (bi < 0 || k > bk || (k == bk && i < bi))) { bk = k; bi = i; }
        }
        if (l == 0) out[out_off + row * out_stride] = bi;
        next_input(bi, row, table, table_off, next, next_off, next_units, position, position_off,
                   position_stride, advance);
    }
#else
    if (l == 0) out[out_off + row * out_stride] = token;
    next_input(token, row, table, table_off, next, next_off, next_units, position, position_off,
               position_stride, advance);
#endif
}
