// Strided copy: dst[dst_offset + sum(i_d * dst_stride_d)] = src[src_offset + sum(i_d * src_stride_d)]
// for every multi-index i of `shape` (row-major order of the logical index).
// Layout: 1-D; one work-item moves one element; global size >= n (bound-checked).
// Build options: -DT=<unsigned type of the element size> -DNDIM=<1..8>. Dtype-agnostic: moves bits.
// Shape and strides arrive as two long4 each (long8 arguments upset some CPU ABIs) (unused dims have size 1), strides in elements.

__kernel void strided_copy(__global T *dst, const long dst_offset, const long4 dst_strides_lo,
                           const long4 dst_strides_hi, __global const T *src, const long src_offset,
                           const long4 src_strides_lo, const long4 src_strides_hi,
                           const long4 shape_lo, const long4 shape_hi, const long n)
{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    long sh[8], ss[8], ds[8];
    vstore4(shape_lo, 0, sh); vstore4(shape_hi, 1, sh);
    vstore4(src_strides_lo, 0, ss); vstore4(src_strides_hi, 1, ss);
    vstore4(dst_strides_lo, 0, ds); vstore4(dst_strides_hi, 1, ds);
    long rest = gid, s = src_offset, d = dst_offset;
    for (int k = NDIM - 1; k >= 0; --k) {
        const long i = rest % sh[k];
        rest /= sh[k];
        s += i * ss[k];
        d += i * ds[k];
    }
    dst[d] = src[s];
}
