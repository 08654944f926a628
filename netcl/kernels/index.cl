// Index-driven data movement: gather along an axis (also index_select / embedding) and scatter_add.
//
// gather_axis: out[c] = x[c with c[AXIS] replaced by idx(c)], idx(c) = index[ioff + sum c_d * is_d]
//   (index strides may be 0: index_select broadcasts a 1-D index over the other axes). Negative
//   indices count from the end; indices still out of range give 0 (netcl checks on the host when
//   asked, see ops.movement). With DEVICE_CHECK (embedding) there is no counting from the end: an
//   index outside [0, axis_size) gives 0 and is reported in the queue's check record (checks.cl;
//   row = the output element's position along the axes before AXIS+1), with no host round trip, so
//   the launch can be recorded in a graph. Layout: 1-D, one work-item per output element
//   (bound-checked). Reads x (any strides) and index; writes out (contiguous).
// scatter_add_atomic: out[dst(c)] += src[c] for every element c of index's shape, where dst(c) is c
//   with c[AXIS] replaced by index(c); float via a compare-and-swap loop on the 32-bit pattern,
//   int via atomic_add. Order of additions is not fixed (non-deterministic rounding for floats).
// scatter_add_segments: the deterministic variant for an index shared by every line (its strides 0 off
//   AXIS: embedding's backward, index_add): out[c] += the sum of src[c with c[AXIS] = order[j]] over j in
//   [start[k], start[k+1]) in increasing j, k = c[AXIS] (segments.cl sorted the positions by index value,
//   each segment in increasing position). Layout: 1-D, one work-item per element c of index's shape with
//   the AXIS extent replaced by out's (bound-checked); it reads its segment's positions and src, and reads
//   and writes out[c] only when the segment is not empty.
// scatter_add_sorted: deterministic variant for any index: the host sorts destinations; work-item s adds
//   the contributions src[order[k]] for k in [seg[s], seg[s+1]) in order into out[dest[s]].
// Build options: T, ACC, IS_HALF, IS_BF16, USE_FP64 (common.cl), -DIT=<index storage type: int or long>
//   -DNDIM=<1..8> -DAXIS=<axis>;
//   -DSCATTER_ATOMIC (+ -DATOMIC_FLOAT for float32) compiles scatter_add_atomic (int32/float32 only).
// Shapes/strides arrive as two long4 each (unused dims: size 1, stride 0), in elements.

#include "common.cl"

/* one element as ACC and back: common.cl's LOAD_T/STORE_T (float16 and bfloat16 storage included) */
#define LOAD(p, i) LOAD_T(p, i)
#define STORE(v, i, p) STORE_T(p, i, (v))

#include "checks.cl"

#define UNPACK(name, lo, hi) long name[8]; vstore4(lo, 0, name); vstore4(hi, 1, name);

__kernel void gather_axis(__global T *out, __global const T *x, const long xoff, const long4 xs_lo,
                          const long4 xs_hi, __global const IT *index, const long ioff,
                          const long4 is_lo, const long4 is_hi, const long4 shape_lo,
                          const long4 shape_hi, const long axis_size, const long n
#ifdef DEVICE_CHECK
                          , __global int *err, const int err_code, const long row_width
#endif
                          )
{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    UNPACK(sh, shape_lo, shape_hi) UNPACK(xs, xs_lo, xs_hi) UNPACK(is, is_lo, is_hi)
    long rest = gid, xo = xoff, io = ioff;
    for (int d = NDIM - 1; d >= 0; --d) {
        const long c = rest % sh[d];
        rest /= sh[d];
        io += c * is[d];
        if (d != AXIS) xo += c * xs[d];
    }
    long k = (long)index[io];
#ifdef DEVICE_CHECK
    if (k < 0 || k >= axis_size) {
        if (gid % row_width == 0) report_check(err, err_code, k, gid / row_width, axis_size);
        STORE((ACC)0, gid, out);
        return;
    }
#else
    if (k < 0) k += axis_size;
    if (k < 0 || k >= axis_size) { STORE((ACC)0, gid, out); return; }
#endif
    STORE(LOAD(x, xo + k * xs[AXIS]), gid, out);
}

#ifdef SCATTER_ATOMIC
#ifdef ATOMIC_FLOAT
inline void atomic_add_value(volatile __global T *p, T v) {
    /* every access atomic (a plain first read would race with other work-items' cmpxchg) */
    volatile __global uint *pu = (volatile __global uint *)p;
    uint seen = atomic_or(pu, 0u), prev;
    while ((prev = atomic_cmpxchg(pu, seen, as_uint(as_float(seen) + v))) != seen)
        seen = prev;
}
#else
inline void atomic_add_value(volatile __global T *p, T v) { atomic_add(p, v); }
#endif

__kernel void scatter_add_atomic(__global T *out, const long4 os_lo, const long4 os_hi,
                                 __global const T *src, const long soff, const long4 ss_lo,
                                 const long4 ss_hi, __global const IT *index, const long ioff,
                                 const long4 is_lo, const long4 is_hi, const long4 shape_lo,
                                 const long4 shape_hi, const long axis_size, const long n
#ifdef DEVICE_CHECK
                          , __global int *err, const int err_code, const long row_width
#endif
                          )
{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    UNPACK(sh, shape_lo, shape_hi) UNPACK(os, os_lo, os_hi) UNPACK(ss, ss_lo, ss_hi)
    UNPACK(is, is_lo, is_hi)
    long rest = gid, oo = 0, so = soff, io = ioff;
    for (int d = NDIM - 1; d >= 0; --d) {
        const long c = rest % sh[d];
        rest /= sh[d];
        io += c * is[d];
        so += c * ss[d];
        if (d != AXIS) oo += c * os[d];
    }
    long k = (long)index[io];
    if (k < 0) k += axis_size;
    if (k < 0 || k >= axis_size) return;
    atomic_add_value((volatile __global T *)(out + oo + k * os[AXIS]), src[so]);
}
#endif  // SCATTER_ATOMIC

__kernel void scatter_add_segments(__global T *out, const long4 os_lo, const long4 os_hi,
                                   __global const T *src, const long soff, const long4 ss_lo,
                                   const long4 ss_hi, const long4 shape_lo, const long4 shape_hi,
                                   __global const int *order, __global const int *start, const long n)
{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    UNPACK(sh, shape_lo, shape_hi) UNPACK(os, os_lo, os_hi) UNPACK(ss, ss_lo, ss_hi)
    long rest = gid, oo = 0, so = soff;
    int k = 0;
    for (int d = NDIM - 1; d >= 0; --d) {
        const long c = rest % sh[d];
        rest /= sh[d];
        oo += c * os[d];
        if (d == AXIS) k = (int)c;
        else so += c * ss[d];
    }
    const int lo = start[k], hi = start[k + 1];
    if (lo == hi) return;
    ACC acc = LOAD(out, oo);
    int j = lo;
    // 4 loads in flight (a frequent id's segment is long), then the adds one by one in position order
    for (; j + 4 <= hi; j += 4) {
        const ACC v0 = LOAD(src, so + (long)order[j] * ss[AXIS]);
        const ACC v1 = LOAD(src, so + (long)order[j + 1] * ss[AXIS]);
        const ACC v2 = LOAD(src, so + (long)order[j + 2] * ss[AXIS]);
        const ACC v3 = LOAD(src, so + (long)order[j + 3] * ss[AXIS]);
        acc += v0;
        acc += v1;
        acc += v2;
        acc += v3;
    }
    for (; j < hi; ++j) acc += LOAD(src, so + (long)order[j] * ss[AXIS]);
    STORE(acc, oo, out);
}

__kernel void scatter_add_sorted(__global T *out, __global const T *src, __global const long *dest,
                                 __global const long *order, __global const long *seg, const long nseg)
{
    const long s = get_global_id(0);
    if (s >= nseg) return;
    ACC acc = LOAD(out, dest[s]);
    for (long k = seg[s]; k < seg[s + 1]; ++k) acc += LOAD(src, order[k]);
    STORE(acc, dest[s], out);
}
