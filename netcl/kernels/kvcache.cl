// KV-cache write: cache[b, h, p + s, d] = x[b, h, s, d] with p = offsets[offset_off + b * offset_stride], the
// cache's current length read on the device (so a recorded decode step replays at the next position).
// x is (B, H, S, D) and the cache (B, H, capacity, D), both read/written through any strides. A row whose
// position p + s falls outside [0, capacity) is reported in the queue's check record (checks.cl) and not
// written.
// Layout: 2-D global (D, B*H*S); one work-item moves one element (bound-checked).
// Build options: -DT=<unsigned type of the element size> (moves bits, any dtype).

#include "checks.cl"

__kernel void cache_write(__global const T *x, const long x_off, const long4 x_strides,
                          __global T *cache, const long cache_off, const long4 cache_strides,
                          __global const int *offsets, const long offset_off, const int offset_stride,
                          const int heads, const int seq, const long rows, const int dim, const int capacity,
                          __global int *err, const int err_code)
{
    const int d = get_global_id(0);
    const long row = get_global_id(1);
    if (d >= dim || row >= rows) return;
    const long b = row / ((long)heads * seq);
    const long h = (row / seq) % heads;
    const long s = row % seq;
    const long p = s + offsets[offset_off + b * offset_stride];
    if (p < 0 || p >= capacity) {
        if (d == 0) report_check(err, err_code, p, row, capacity);
        return;
    }
    cache[cache_off + b * cache_strides.s0 + h * cache_strides.s1 + p * cache_strides.s2 + d * cache_strides.s3] =
        x[x_off + b * x_strides.s0 + h * x_strides.s1 + s * x_strides.s2 + d * x_strides.s3];
}
