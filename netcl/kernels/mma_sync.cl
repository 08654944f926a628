// mma.sync and ldmatrix from OpenCL C (NVIDIA inline PTX), shared by gemm_mma.cl and attention_mma.cl:
// MMA(d, a, b, c) (d = a x b + c for one warp: m16n8k16 for MMA_F16 / MMA_BF16, m16n8k8 TF32 for MMA_TF32)
// and LDSM(r, PTR, trans) (ldmatrix.x4), nc_cp_async16 (cp.async), with MMA_EMULATE their local-memory emulation for any OpenCL
// device (PoCL, Oclgrind). The includer defines KSTEP (16, or 8 for TF32) and, where MMA is used, has
// `lane`, `g` = lane / 4, `t` = lane % 4, `warp` and, when emulating, the per-warp scratch tiles
// `scratch_a` (16 x KSTEP floats a warp) and `scratch_b` (KSTEP x 8) in local memory.
#ifndef NETCL_MMA_SYNC_CL
#define NETCL_MMA_SYNC_CL

#ifdef MMA_EMULATE
inline float lane_value(uint bits16_or_32) {
#if defined(MMA_TF32)
    return as_float(bits16_or_32);
#elif defined(MMA_BF16)
    return as_float(bits16_or_32 << 16);
#else
    ushort h = (ushort)bits16_or_32;
    return vload_half(0, (__private const half *)&h);
#endif
}

// d = a x b + c for one warp, through local scratch: every lane scatters its fragments, then computes
// its four outputs from the whole 16 x KSTEP and KSTEP x 8 tiles. All lanes of the work-group call it
// the same number of times (the barriers are uniform).
inline void mma(float d[4], const uint a[4], const uint b[2], const float c[4],
                __local float *sa, __local float *sb, const int lane) {
    const int g = lane >> 2, t = lane & 3;
#if defined(MMA_TF32)
    sa[g * KSTEP + t] = lane_value(a[0]);           sa[(g + 8) * KSTEP + t] = lane_value(a[1]);
    sa[g * KSTEP + t + 4] = lane_value(a[2]);       sa[(g + 8) * KSTEP + t + 4] = lane_value(a[3]);
    sb[t * 8 + g] = lane_value(b[0]);               sb[(t + 4) * 8 + g] = lane_value(b[1]);
#else
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        sa[g * KSTEP + 2 * t + h] = lane_value(a[0] >> (16 * h));
        sa[(g + 8) * KSTEP + 2 * t + h] = lane_value(a[1] >> (16 * h));
        sa[g * KSTEP + 2 * t + 8 + h] = lane_value(a[2] >> (16 * h));
        sa[(g + 8) * KSTEP + 2 * t + 8 + h] = lane_value(a[3] >> (16 * h));
        sb[(2 * t + h) * 8 + g] = lane_value(b[0] >> (16 * h));
        sb[(2 * t + 8 + h) * 8 + g] = lane_value(b[1] >> (16 * h));
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int o = 0; o < 4; ++o) {
        const int row = g + (o >> 1) * 8, col = 2 * t + (o & 1);
        float s = c[o];
        for (int k = 0; k < KSTEP; ++k) s += sa[row * KSTEP + k] * sb[k * 8 + col];
        d[o] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define MMA(d, a, b, c) mma(d, a, b, c, scratch_a + warp * 16 * KSTEP, scratch_b + warp * KSTEP * 8, lane)
#define MMA_UNROLL  // loops around the emulation's barriers stay rolled: PoCL builds them many times faster
#else
#if defined(MMA_TF32)
#define MMA_OP "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
#elif defined(MMA_BF16)
#define MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#else
#define MMA_OP "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#endif
#define MMA_UNROLL _Pragma("unroll")
#define MMA(d, a, b, c)                                                                                 \
    asm(MMA_OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                       \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#endif

// four 8 x 8 matrices of 16-bit values: lanes 8i..8i+7 give the row addresses of matrix i; lane l
// receives, in r[i], the pair (row l / 4, columns 2 (l % 4), +1) of matrix i, or with TRANS the pair
// (rows 2 (l % 4), +1; column l / 4). TF32 (no .trans): the same 16-byte rows seen as 8 x 4 matrices of
// 32-bit values, lane l gets (row l / 4, column l % 4): exactly mma.m16n8k8's A and "col" B fragments.
// PTR is a macro of the lane giving its row address (the emulation evaluates it for the lanes whose rows
// this lane receives: no exchange, no barrier).
#ifdef MMA_EMULATE
#if defined(MMA_TF32)
#define LDSM(r, PTR, trans)                                                                             \
    do {                                                                                                \
        for (int i_ = 0; i_ < 4; ++i_) r[i_] = PTR(8 * i_ + g)[t];                                      \
    } while (0)
#else
#define LDSM(r, PTR, trans)                                                                             \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int i_ = 0; i_ < 4; ++i_) {                                                                \
            if (trans) r[i_] = (uint)PTR(8 * i_ + 2 * t)[g] | ((uint)PTR(8 * i_ + 2 * t + 1)[g] << 16);     \
            else r[i_] = (uint)PTR(8 * i_ + g)[2 * t] | ((uint)PTR(8 * i_ + g)[2 * t + 1] << 16);           \
        }                                                                                               \
    } while (0)
#endif
#else
#define LDSM(r, PTR, trans)                                                                             \
    do {                                                                                                \
        if (trans)                                                                                      \
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"          \
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                             \
                         : "r"((uint)(ulong)PTR(lane)) : "memory");                                     \
        else                                                                                            \
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"                \
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                             \
                         : "r"((uint)(ulong)PTR(lane)) : "memory");                                     \
    } while (0)
#endif

// one 16-byte copy global -> local through cp.async (sm_80+: the copy flies while the work-item goes on;
// cp.async.commit_group / wait_group order them); `bytes` < 16 fills the rest with zeros (0: no read at
// all). Emulated: a plain copy.
inline void nc_cp_async16(__local void *dst, __global const void *src, const int bytes) {
#ifdef MMA_EMULATE
    uint4 v = (uint4)(0);
    if (bytes == 16) v = vload4(0, (__global const uint *)src);
    else if (bytes > 0) {
        uint w[4] = {0, 0, 0, 0};
        for (int i = 0; i < bytes / 2; ++i) ((ushort *)w)[i] = ((__global const ushort *)src)[i];
        v = (uint4)(w[0], w[1], w[2], w[3]);
    }
    *(__local uint4 *)dst = v;
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"((uint)(ulong)dst), "l"((ulong)src), "r"(bytes) : "memory");
#endif
}

// one 4-byte copy global -> local through cp.async (.ca: the only cache mode for copies under 16 bytes);
// `bytes` 0 writes a zero without reading. Emulated: a plain copy.
inline void nc_cp_async4(__local void *dst, __global const void *src, const int bytes) {
#ifdef MMA_EMULATE
    *(__local uint *)dst = bytes ? *(__global const uint *)src : 0u;
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"((uint)(ulong)dst), "l"((ulong)src), "r"(bytes) : "memory");
#endif
}

#endif
