/* float16 <-> float32 of one value: nc_h2f (exact), nc_f2h (round to nearest even, NaN and infinities
 * kept); bfloat16's nc_bf2f and nc_f2bf at the end. Included by common.cl and by every JIT kernel
 * (netcl.jit.codegen's preamble). On NVIDIA
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
/* float16 N-wide 16-byte-aligned loads and stores (nc_ldhN, nc_sthN; the JIT's kernels and norm.cl). On
   NVIDIA raw bits and the conversion instructions: its vloada_half8/vstorea_half8 moved a quarter of
   float32's bytes per second on the H200; elsewhere the OpenCL built-ins. */
#ifdef NC_NVIDIA
inline float2 nc_h2f2(const uint u) {
    float lo, hi;
    asm("{ .reg .b16 l, u; mov.b32 {l, u}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, u; }"
        : "=f"(lo), "=f"(hi) : "r"(u));
    return (float2)(lo, hi);
}
inline uint nc_f2h2(const float2 v) {
#if NC_NVIDIA >= 80
    uint r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v.y), "f"(v.x));
    return r;
#else
    return (uint)nc_f2h(v.x) | ((uint)nc_f2h(v.y) << 16);  /* the packed form is sm_80's */
#endif
}
inline float2 nc_ldh2(__global const half *p) { return nc_h2f2(*(__global const uint *)p); }
inline float4 nc_ldh4(__global const half *p) {
    const uint2 u = *(__global const uint2 *)p; return (float4)(nc_h2f2(u.x), nc_h2f2(u.y)); }
inline float8 nc_ldh8(__global const half *p) {
    const uint4 u = *(__global const uint4 *)p;
    return (float8)(nc_h2f2(u.x), nc_h2f2(u.y), nc_h2f2(u.z), nc_h2f2(u.w)); }
inline float16 nc_ldh16(__global const half *p) { return (float16)(nc_ldh8(p), nc_ldh8(p + 8)); }
inline void nc_sth2(const float2 v, __global half *p) { *(__global uint *)p = nc_f2h2(v); }
inline void nc_sth4(const float4 v, __global half *p) {
    *(__global uint2 *)p = (uint2)(nc_f2h2(v.s01), nc_f2h2(v.s23)); }
inline void nc_sth8(const float8 v, __global half *p) {
    *(__global uint4 *)p = (uint4)(nc_f2h2(v.s01), nc_f2h2(v.s23), nc_f2h2(v.s45), nc_f2h2(v.s67)); }
inline void nc_sth16(const float16 v, __global half *p) { nc_sth8(v.lo, p); nc_sth8(v.hi, p + 8); }
#define NC_LDH(p, i) nc_h2f(((__global const ushort *)(p))[i])
#define NC_STH(p, i, v) (((__global ushort *)(p))[i] = nc_f2h(v))
#else
#define nc_ldh2(p) vloada_half2(0, p)
#define nc_ldh4(p) vloada_half4(0, p)
#define nc_ldh8(p) vloada_half8(0, p)
#define nc_ldh16(p) vloada_half16(0, p)
#define nc_sth2(v, p) vstorea_half2(v, 0, p)
#define nc_sth4(v, p) vstorea_half4(v, 0, p)
#define nc_sth8(v, p) vstorea_half8(v, 0, p)
#define nc_sth16(v, p) vstorea_half16(v, 0, p)
#define NC_LDH(p, i) vload_half(i, p)
#define NC_STH(p, i, v) vstore_half(v, i, p)
#endif
/* bfloat16 (the high 16 bits of a float32, in a ushort) <-> float: nc_bf2f exact; nc_f2bf rounds to nearest
   even, keeps infinities and subnormals, and a NaN stays NaN. On NVIDIA sm_80 and later the conversion
   instruction (cvt.rn.bf16.f32; cvt.rn.bf16x2.f32 packs two: nc_f2bf2u), elsewhere bit operations: adding
   0x7fff plus the lowest kept bit (ties to even) carries into the exponent where it should, and a NaN keeps
   its sign and top payload bits and is made quiet so that it cannot round into an infinity (the
   instruction gives the canonical NaN: NaN all the same). */
inline float nc_bf2f(const ushort h) { return as_float(((uint)h) << 16); }
#if defined(NC_NVIDIA) && NC_NVIDIA >= 80
inline ushort nc_f2bf(const float f) {
    uint r;
    asm("{ .reg .b16 l; cvt.rn.bf16.f32 l, %1; mov.b32 %0, {l, l}; }" : "=r"(r) : "f"(f));
    return (ushort)r;
}
inline uint nc_f2bf2u(const float2 v) {
    uint r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v.y), "f"(v.x));
    return r;
}
#define NC_BF16_CVT 1
/* bfloat16 N-wide 16-byte-aligned loads and stores through 32-bit words (nc_ldbfN, nc_stbfN; norm.cl): two
   lanes a word (NVIDIA is little-endian: the lower address in the low half), the stores' pairs rounded by
   one instruction; the same bits as the lane-by-lane forms */
inline float2 nc_bf2f2u(const uint u) { return (float2)(as_float(u << 16), as_float(u & 0xffff0000u)); }
inline float4 nc_ldbf4(__global const ushort *p) {
    const uint2 u = *(__global const uint2 *)p; return (float4)(nc_bf2f2u(u.x), nc_bf2f2u(u.y)); }
inline float8 nc_ldbf8(__global const ushort *p) {
    const uint4 u = *(__global const uint4 *)p;
    return (float8)(nc_bf2f2u(u.x), nc_bf2f2u(u.y), nc_bf2f2u(u.z), nc_bf2f2u(u.w)); }
inline void nc_stbf4(const float4 v, __global ushort *p) {
    *(__global uint2 *)p = (uint2)(nc_f2bf2u(v.s01), nc_f2bf2u(v.s23)); }
inline void nc_stbf8(const float8 v, __global ushort *p) {
    *(__global uint4 *)p = (uint4)(nc_f2bf2u(v.s01), nc_f2bf2u(v.s23), nc_f2bf2u(v.s45), nc_f2bf2u(v.s67)); }
#else
inline ushort nc_f2bf(const float f) {
    const uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x0040u);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#endif
#endif
