// Sorting along the last axis of a (rows, n) view: a bitonic network over (value, position) pairs
// (ops.sorting: sort, argsort, and the sorted values' gradient).
//
// Each row is padded to P, the power of two >= n (at least 2); a position p >= n is padding, ordered after
// every element, so the first n places of a sorted row hold its elements. The network compares (value,
// position) pairs: no two are equal, so the order is total and equal values keep their positions' order
// (the sort is stable whatever stable= asks). NaN orders after every number (descending: before every
// number, as PyTorch's descending sort), NaNs among themselves by position; -0.0 and 0.0 are equal.
//
// The padded rows lie end to end: element e = row * P + p. Stage k (2, 4, ..., P) merges runs of k; its step j
// (k/2, ..., 1) compares e with e + j for each e whose bit j is clear, in ascending order where p & k is 0 and
// descending elsewhere (at k = P every row ascends, in comes_before's order).
//
// sort_rows: rows of P <= CHUNK (= 2 * WG): global groups * WG, local WG. A work-group holds CHUNK consecutive
//   padded elements in local memory (CHUNK / P rows; rows past `rows` are filler, never written), each
//   work-item loading two and comparing one pair a step, runs every stage, and writes the n values (T) and
//   indices (long) of each of its rows into the contiguous (rows, n) outputs. Reads x (any row and column
//   strides); writes values, indices.
// sort_first: rows of P > CHUNK: sort_rows' stages up to CHUNK, written to the scratch keys (ACC) and
//   positions (int) of rows * P elements.
// sort_step: one step j >= CHUNK of stage k: global rows * P / 2, one work-item per compared pair (bound-
//   checked). Reads and writes scratch.
// sort_merge: the steps j < CHUNK of stage k (> CHUNK) in local memory (sort_rows' layout), then written back
//   to scratch, or, for the last stage (to_out), into the outputs.
// sort_scatter: the sorted values' gradient, gx[row, indices[row, j]] = g[row, j]: global rows * n, one
//   work-item per element (bound-checked); every gx element is written once (each row of indices is a
//   permutation). Reads g (any strides) and indices; writes gx (contiguous).
//
// Build options: T, ACC, IS_HALF, IS_BF16, USE_FP64 (common.cl); FLOATING for a floating dtype (NaN order);
// WG (the local size of sort_rows, sort_first and sort_merge: a power of two). Runtime: descending (0 or 1).

#include "common.cl"

#ifndef WG
#define WG 256
#endif
#define CHUNK (2 * WG)

#ifdef FLOATING
#define NC_ISNAN(v) isnan(v)
#else
#define NC_ISNAN(v) 0
#endif

/* Whether (a, at position ia) comes before (b, at ib) in a row of n elements. */
inline int comes_before(const ACC a, const int ia, const ACC b, const int ib, const int n, const int descending)
{
    if (ia >= n || ib >= n) return ia < ib;  /* padding after every element, and among itself by position */
    const int a_nan = NC_ISNAN(a) ? 1 : 0, b_nan = NC_ISNAN(b) ? 1 : 0;
    if (a_nan != b_nan) return descending ? a_nan : b_nan;
    if (!a_nan && a != b) return descending ? a > b : a < b;
    return ia < ib;
}

/* The work-group's CHUNK elements from x: element `base + l` is (row, p) of the padded rows. */
inline void load_rows(__global const T *x, const long x_off, const long row_stride, const long col_stride,
                      const long rows, const int n, const long P, const long base, const int lid,
                      __local ACC *key, __local int *pos)
{
    for (int h = 0; h < 2; ++h) {
        const int l = lid + h * WG;
        const long e = base + l, row = e / P;
        const int p = (int)(e - row * P);
        key[l] = (row < rows && p < n) ? LOAD_T(x, x_off + row * row_stride + p * col_stride) : (ACC)0;
        pos[l] = p;
    }
}

/* Stages k_lo .. k_hi of the network on the work-group's chunk (steps j >= CHUNK are sort_step's). */
inline void chunk_stages(__local ACC *key, __local int *pos, const long base, const int lid, const long k_lo,
                         const long k_hi, const long P, const int n, const int descending)
{
    for (long k = k_lo; k <= k_hi; k <<= 1) {
        for (int j = (int)min(k, (long)CHUNK) >> 1; j > 0; j >>= 1) {
            const int i = ((lid & ~(j - 1)) << 1) | (lid & (j - 1));
            const int up = (((base + i) & (P - 1)) & k) == 0;
            const ACC a = key[i], b = key[i + j];
            const int ia = pos[i], ib = pos[i + j];
            if (up ? comes_before(b, ib, a, ia, n, descending) : comes_before(a, ia, b, ib, n, descending)) {
                key[i] = b;
                key[i + j] = a;
                pos[i] = ib;
                pos[i + j] = ia;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
}

/* The chunk's real elements into the (rows, n) outputs. */
inline void store_rows(__local const ACC *key, __local const int *pos, const long base, const int lid,
                       const long rows, const int n, const long P, __global T *values, __global long *indices)
{
    for (int h = 0; h < 2; ++h) {
        const int l = lid + h * WG;
        const long e = base + l, row = e / P;
        const int p = (int)(e - row * P);
        if (row < rows && p < n) {
            STORE_T(values, row * n + p, key[l]);
            indices[row * n + p] = pos[l];
        }
    }
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void sort_rows(__global const T *x, const long x_off, const long row_stride, const long col_stride,
               const long rows, const int n, const long P, const int descending, __global T *values,
               __global long *indices)
{
    __local ACC key[CHUNK];
    __local int pos[CHUNK];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * CHUNK;
    load_rows(x, x_off, row_stride, col_stride, rows, n, P, base, lid, key, pos);
    barrier(CLK_LOCAL_MEM_FENCE);
    chunk_stages(key, pos, base, lid, 2, P, P, n, descending);
    store_rows(key, pos, base, lid, rows, n, P, values, indices);
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void sort_first(__global const T *x, const long x_off, const long row_stride, const long col_stride,
                const long rows, const int n, const long P, const int descending, __global ACC *skey,
                __global int *spos)
{
    __local ACC key[CHUNK];
    __local int pos[CHUNK];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * CHUNK;
    load_rows(x, x_off, row_stride, col_stride, rows, n, P, base, lid, key, pos);
    barrier(CLK_LOCAL_MEM_FENCE);
    chunk_stages(key, pos, base, lid, 2, CHUNK, P, n, descending);
    for (int h = 0; h < 2; ++h) {
        const int l = lid + h * WG;
        skey[base + l] = key[l];
        spos[base + l] = pos[l];
    }
}

__kernel void sort_step(__global ACC *skey, __global int *spos, const long pairs, const long P, const long k,
                        const long j, const int n, const int descending)
{
    const long t = get_global_id(0);
    if (t >= pairs) return;
    const long i = ((t & ~(j - 1)) << 1) | (t & (j - 1));
    const int up = ((i & (P - 1)) & k) == 0;
    const ACC a = skey[i], b = skey[i + j];
    const int ia = spos[i], ib = spos[i + j];
    if (up ? comes_before(b, ib, a, ia, n, descending) : comes_before(a, ia, b, ib, n, descending)) {
        skey[i] = b;
        skey[i + j] = a;
        spos[i] = ib;
        spos[i + j] = ia;
    }
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void sort_merge(__global ACC *skey, __global int *spos, const long rows, const int n, const long P,
                const long k, const int descending, const int to_out, __global T *values,
                __global long *indices)
{
    __local ACC key[CHUNK];
    __local int pos[CHUNK];
    const int lid = get_local_id(0);
    const long base = (long)get_group_id(0) * CHUNK;
    for (int h = 0; h < 2; ++h) {
        const int l = lid + h * WG;
        key[l] = skey[base + l];
        pos[l] = spos[base + l];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    chunk_stages(key, pos, base, lid, k, k, P, n, descending);
    if (to_out) {
        store_rows(key, pos, base, lid, rows, n, P, values, indices);
    } else {
        for (int h = 0; h < 2; ++h) {
            const int l = lid + h * WG;
            skey[base + l] = key[l];
            spos[base + l] = pos[l];
        }
    }
}

__kernel void sort_scatter(__global const T *g, const long g_off, const long g_row_stride,
                           const long g_col_stride, __global const long *indices, const long rows, const long n,
                           __global T *gx)
{
    const long e = get_global_id(0);
    if (e >= rows * n) return;
    const long row = e / n, j = e - row * n;
    STORE_T(gx, row * n + indices[e], LOAD_T(g, g_off + row * g_row_stride + j * g_col_stride));
}
