/* float16 <-> float32 of one value: nc_h2f (exact), nc_f2h (round to nearest even, NaN and infinities
 * kept). Included by common.cl and by every JIT kernel (netcl.jit.codegen's preamble). On NVIDIA
 * (NC_NVIDIA, set by netcl.core.backend for every program built there) through the conversion
 * instructions on raw bits: its vload_half/vstore_half paths ran float16 kernels at a quarter to a half of
 * bfloat16's bandwidth on the H200 (bench/NOTES.md, mixed precision); elsewhere the OpenCL built-ins. */
#ifndef NETCL_HALF_CL
#define NETCL_HALF_CL
#ifdef NC_NVIDIA
inline float nc_h2f(const ushort h) {
    float f;
    asm("{ .reg .b16 l, u; mov.b32 {l, u}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"((uint)h));
    return f;
}
inline ushort nc_f2h(const float f) {
    uint r;
    asm("{ .reg .b16 l; cvt.rn.f16.f32 l, %1; mov.b32 %0, {l, l}; }" : "=r"(r) : "f"(f));
    return (ushort)r;
}
#else
inline float nc_h2f(ushort h) { return vload_half(0, (__private const half *)&h); }
inline ushort nc_f2h(const float f) { ushort h; vstore_half(f, 0, (__private half *)&h); return h; }
#endif
#endif
