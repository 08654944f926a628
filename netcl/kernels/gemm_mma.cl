// GEMM on NVIDIA's matrix units from OpenCL C: mma.sync through inline PTX (NVIDIA's OpenCL compiler
// accepts it); float16 / bfloat16 inputs (m16n8k16) or TF32 from float32 inputs (m16n8k8), float32
// accumulation, the fused epilogue of gemm_common.cl. No cl_khr_fp16 is needed: half values are only
// moved as 16-bit patterns and multiplied by the matrix units.
//
// Work layout: a work-group of (BM/WM) x (BN/WN) warps computes a BM x BN block of C; each warp a
// WM x WN patch as (WM/16) x (WN/8) mma tiles of 16 x 8, accumulators in registers. K is walked in
// steps of BK: both operands' BM x BK and BN x BK slices are staged in local memory (B transposed,
// k contiguous, as the "col" operand of mma wants), then each warp loads its fragments as 32-bit
// pairs and issues the mma instructions.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 / m16n8k8; g = lane / 4, t = lane % 4):
//   A 16 x 16: a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)   [k16; tf32 k8: a0 (g, t)
//              a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)]
//   B 16 x 8:  b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g)                            [tf32: b0 (t, g) b1 (t+4, g)]
//   C 16 x 8:  c0 c1 (g, 2t..2t+1) c2 c3 (g+8, 2t..2t+1)
//
// ASYNC (with ALIGNED, rows and offsets 16-byte aligned): a ring of STAGES local tiles filled by cp.async
// (sm_80+): the copies of tile k + STAGES - 1 fly while the matrix units work on tile k, without
// registers in between; one barrier per k tile. LDMATRIX (16-bit inputs): fragments read with
// ldmatrix.x4 (four 8 x 8 matrices per instruction; .trans for the k-major B tile) instead of one
// 32-bit local load per register.
//
// Defines: MMA_F16 | MMA_BF16 | MMA_TF32 (input kind), BM, BN, BK, WM, WN, PAD (local row padding,
// elements), ASYNC, STAGES, LDMATRIX, MMA_EMULATE (run the same fragments through a local-memory emulation of mma: lets the
// kernel's index arithmetic be tested on any OpenCL device, e.g. PoCL and Oclgrind; cp.async becomes
// a plain copy and ldmatrix an exchange of row addresses through local memory), plus the GEMM
// options of gemm_common.cl. Storage: MMA_F16 = half (IS_HALF), MMA_BF16 = bfloat16 bits, MMA_TF32 = float.

#include "gemm_common.cl"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 32
#endif
#ifndef PAD
#define PAD 8
#endif
#ifndef PADB
#define PADB 8
#endif
#ifndef STAGES
#define STAGES 2
#endif
#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define THREADS (WARPS_M * WARPS_N * 32)
#define MT (WM / 16)
#define NT (WN / 8)
#if (BM % WM) || (BN % WN) || (WM % 16) || (WN % 8)
#error "BM, BN must be multiples of the warp patch WM x WN, WM of 16 and WN of 8"
#endif

#if defined(MMA_TF32)
typedef uint LTYPE;          // one 32-bit element per k
#define KSTEP 8
#define LD (BK + PAD)
inline uint to_lds(__global const STORE_T *p, long i) {
    uint r;
#ifdef MMA_EMULATE
    uint x = as_uint(p[i]);
    r = (x + 0x1000u) & 0xffffe000u;  // round to nearest (ties away), as cvt.rna.tf32.f32
#else
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(p[i]));
#endif
    return r;
}
#else
typedef ushort LTYPE;        // 16-bit patterns, read back in pairs
#define KSTEP 16
#define LD (BK + PAD)
inline ushort to_lds(__global const STORE_T *p, long i) { return ((__global const ushort *)p)[i]; }
#endif

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

// a pair of 16-bit elements (k, k+1) of a local row as one 32-bit register (k even)
#if defined(MMA_TF32)
#define FRAG(tile, row, k) ((tile)[(row) * LD + (k)])
#define VEC 4               // elements per 16-byte global load
#else
#define FRAG(tile, row, k) (((__local const uint *)(tile))[((row) * LD + (k)) >> 1])
#define VEC 8
#endif
#define LDB (BN + PADB)     // row length of the k-major B tile (B_KMAJOR)

#ifdef ALIGNED
// 16-byte loads: the operand's contiguous axis has stride 1, and every row start is a multiple of VEC
inline uint4 load_vec(__global const STORE_T *p, const long i, const bool whole, const int left) {
#if defined(MMA_TF32)
    float4 v;
    if (whole) v = vload4(0, p + i);
    else {
        v = (float4)(0.0f);
        if (left > 0) v.s0 = p[i];
        if (left > 1) v.s1 = p[i + 1];
        if (left > 2) v.s2 = p[i + 2];
    }
    uint4 r;
#ifdef MMA_EMULATE
    r = (as_uint4(v) + (uint4)(0x1000u)) & (uint4)(0xffffe000u);
#else
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s0) : "f"(v.s0));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s1) : "f"(v.s1));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s2) : "f"(v.s2));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.s3) : "f"(v.s3));
#endif
    return r;
#else
    __global const ushort *q = (__global const ushort *)p + i;
    if (whole) return as_uint4(vload8(0, q));
    ushort8 v = (ushort8)(0);
    if (left > 0) v.s0 = q[0];
    if (left > 1) v.s1 = q[1];
    if (left > 2) v.s2 = q[2];
    if (left > 3) v.s3 = q[3];
    if (left > 4) v.s4 = q[4];
    if (left > 5) v.s5 = q[5];
    if (left > 6) v.s6 = q[6];
    return as_uint4(v);
#endif
}
#endif

#ifdef ASYNC
// one 16-byte copy global -> local; `bytes` < 16 fills the rest with zeros (0: no read at all)
inline void cp_async16(__local LTYPE *dst, __global const STORE_T *src, const int bytes) {
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
#define MMA_STR2(x) #x
#define MMA_STR(x) MMA_STR2(x)
#ifdef MMA_EMULATE
#define CP_COMMIT()
#define CP_WAIT()
#else
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_WAIT() asm volatile("cp.async.wait_group " MMA_STR(STAGES - 2) ";" ::: "memory")
#endif
#endif

#if defined(MMA_TF32) && defined(ASYNC)
// tiles hold raw float32 bits (cp.async cannot convert): fragments are rounded to TF32 as they are read
inline uint tf32_frag(uint x) {
#ifdef MMA_EMULATE
    return (x + 0x1000u) & 0xffffe000u;
#else
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(as_float(x)));
    return r;
#endif
}
#define CVT_FRAG(x) tf32_frag(x)
#else
#define CVT_FRAG(x) (x)
#endif

#ifdef LDMATRIX
#if defined(MMA_TF32) || (WN % 16)
#error "LDMATRIX takes 16-bit inputs and warp patches WN a multiple of 16"
#endif
// four 8 x 8 matrices of 16-bit values: lanes 8i..8i+7 give the row addresses of matrix i; lane l
// receives, in r[i], the pair (row l / 4, columns 2 (l % 4), +1) of matrix i, or with TRANS the pair
// (rows 2 (l % 4), +1; column l / 4). PTR is a macro of the lane giving its row address (the emulation
// evaluates it for the lanes whose rows this lane receives: no exchange, no barrier).
#ifdef MMA_EMULATE
#define LDSM(r, PTR, trans)                                                                             \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int i_ = 0; i_ < 4; ++i_) {                                                                \
            if (trans) r[i_] = (uint)PTR(8 * i_ + 2 * t)[g] | ((uint)PTR(8 * i_ + 2 * t + 1)[g] << 16);     \
            else r[i_] = (uint)PTR(8 * i_ + g)[2 * t] | ((uint)PTR(8 * i_ + g)[2 * t + 1] << 16);           \
        }                                                                                               \
    } while (0)
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
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void gemm_mma(GEMM_ARGS)
{
#ifdef B_KMAJOR
#define B_TILE (BK * LDB)   // B[k0 + k, n0 + c] at k * LDB + c (B's rows contiguous along n)
#else
#define B_TILE (BN * LD)    // B[k0 + k, n0 + c] at c * LD + k (k contiguous: the mma "col" operand)
#endif
    // 16-byte aligned: tiles are written (and, with ASYNC/LDMATRIX, read) 16 bytes at a time
#ifdef ASYNC
    __local LTYPE As[STAGES * BM * LD] __attribute__((aligned(16)));  // stage s: A[m0 + r, k0 + k] at s * BM * LD + r * LD + k
    __local LTYPE Bs[STAGES * B_TILE] __attribute__((aligned(16)));
#else
    __local LTYPE As[BM * LD] __attribute__((aligned(16)));           // A[m0 + r, k0 + k] at r * LD + k
    __local LTYPE Bs[B_TILE] __attribute__((aligned(16)));
#endif
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS_M * WARPS_N * 16 * KSTEP];
    __local float scratch_b[WARPS_M * WARPS_N * KSTEP * 8];
#endif
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int n0 = get_group_id(0) * BN, m0 = get_group_id(1) * BM;
    GEMM_SELECT_BATCH(get_group_id(2));

    float acc[MT][NT][4];
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NT; ++j)
            #pragma unroll
            for (int o = 0; o < 4; ++o) acc[i][j][o] = 0.0f;

#if (defined(ASYNC) || defined(ALIGNED)) && (((BM * BK) % (VEC * THREADS)) || ((BN * BK) % (VEC * THREADS)))
#error "16-byte chunks of the BM x BK and BK x BN tiles must divide evenly among the work-group's threads"
#endif
#if defined(ASYNC)
    // every 16-byte chunk of a k tile: A's BM x BK, then B's (k-major rows along n, or rows along k)
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
#define ISSUE(kt)                                                                                       \
    do {                                                                                                \
        const int k0_ = (kt) * BK, s_ = (kt) % STAGES;                                                  \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            const int gm = m0 + r, gk = k0_ + kc, left = gm < M ? min(VEC, K - gk) : 0;                 \
            cp_async16(&As[s_ * BM * LD + r * LD + kc], left > 0 ? A + (long)gm * a_rs + gk : A,         \
                       max(left, 0) * (int)sizeof(STORE_T));                                            \
        }                                                                                               \
        ISSUE_B(k0_, s_);                                                                               \
    } while (0)
#ifdef B_KMAJOR
#define ISSUE_B(k0_, s_)                                                                                \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        const int gk = k0_ + k, gn = n0 + nc, left = gk < K ? min(VEC, N - gn) : 0;                    \
        cp_async16(&Bs[s_ * B_TILE + k * LDB + nc], left > 0 ? B + (long)gk * b_ks + gn : B,             \
                   max(left, 0) * (int)sizeof(STORE_T));                                                \
    }
#else
#define ISSUE_B(k0_, s_)                                                                                \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        const int gn = n0 + c, gk = k0_ + kc, left = gn < N ? min(VEC, K - gk) : 0;                    \
        cp_async16(&Bs[s_ * B_TILE + c * LD + kc], left > 0 ? B + (long)gn * b_ns + gk : B,              \
                   max(left, 0) * (int)sizeof(STORE_T));                                                \
    }
#endif
    const int nk = (K + BK - 1) / BK;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) ISSUE(s);
        CP_COMMIT();
    }
    for (int kt = 0; kt < nk; ++kt) {
        CP_WAIT();                       // tile kt has landed (at most STAGES - 2 younger groups in flight)
        barrier(CLK_LOCAL_MEM_FENCE);    // ... for every thread; and everyone is done with tile kt - 1
        if (kt + STAGES - 1 < nk) ISSUE(kt + STAGES - 1);   // into the stage tile kt - 1 used
        CP_COMMIT();
        __local const LTYPE *as = As + (kt % STAGES) * BM * LD, *bs = Bs + (kt % STAGES) * B_TILE;
#elif defined(ALIGNED)
    // register prefetch: the next k slice is in flight while the matrix units work on this one
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
    uint4 ra[CH_A], rb[CH_B];
#define FETCH(k0)                                                                                       \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            const int gm = m0 + r, gk = (k0) + kc;                                                      \
            ra[h] = gm < M ? load_vec(A, (long)gm * a_rs + gk, gk + VEC <= K, K - gk) : (uint4)(0);     \
        }                                                                                               \
        FETCH_B(k0);                                                                                    \
    } while (0)
#ifdef B_KMAJOR
#define FETCH_B(k0)                                                                                     \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        const int gk = (k0) + k, gn = n0 + nc;                                                          \
        rb[h] = gk < K ? load_vec(B, (long)gk * b_ks + gn, gn + VEC <= N, N - gn) : (uint4)(0);         \
    }
#define STORE_B()                                                                                       \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        *(__local uint4 *)&Bs[k * LDB + nc] = rb[h];                                                    \
    }
#else
#define FETCH_B(k0)                                                                                     \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        const int gn = n0 + c, gk = (k0) + kc;                                                          \
        rb[h] = gn < N ? load_vec(B, (long)gn * b_ns + gk, gk + VEC <= K, K - gk) : (uint4)(0);         \
    }
#define STORE_B()                                                                                       \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        *(__local uint4 *)&Bs[c * LD + kc] = rb[h];                                                     \
    }
#endif
#define STORE_TILES()                                                                                   \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            *(__local uint4 *)&As[r * LD + kc] = ra[h];                                                 \
        }                                                                                               \
        STORE_B();                                                                                      \
    } while (0)
    FETCH(0);
    STORE_TILES();
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k0 = 0; k0 < K; k0 += BK) {
        if (k0 + BK < K) FETCH(k0 + BK);
        __local const LTYPE *as = As, *bs = Bs;
#else
    for (int k0 = 0; k0 < K; k0 += BK) {
        // any strides: element loads, consecutive work-items along the operand's contiguous axis
        if (a_ks == 1) {
            for (int idx = tid; idx < BM * BK; idx += THREADS) {
                const int r = idx / BK, k = idx % BK, gm = m0 + r, gk = k0 + k;
                As[r * LD + k] = (gm < M && gk < K) ? to_lds(A, (long)gm * a_rs + gk) : (LTYPE)0;
            }
        } else {
            for (int idx = tid; idx < BM * BK; idx += THREADS) {
                const int r = idx % BM, k = idx / BM, gm = m0 + r, gk = k0 + k;
                As[r * LD + k] = (gm < M && gk < K) ? to_lds(A, (long)gm * a_rs + (long)gk * a_ks) : (LTYPE)0;
            }
        }
#ifdef B_KMAJOR
        for (int idx = tid; idx < BN * BK; idx += THREADS) {
            const int c = idx % BN, k = idx / BN, gn = n0 + c, gk = k0 + k;
            Bs[k * LDB + c] = (gn < N && gk < K) ? to_lds(B, (long)gk * b_ks + (long)gn * b_ns) : (LTYPE)0;
        }
#else
        for (int idx = tid; idx < BN * BK; idx += THREADS) {
            const int c = idx / BK, k = idx % BK, gn = n0 + c, gk = k0 + k;
            Bs[c * LD + k] = (gn < N && gk < K) ? to_lds(B, (long)gk * b_ks + (long)gn * b_ns) : (LTYPE)0;
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        __local const LTYPE *as = As, *bs = Bs;
#endif
        MMA_UNROLL
        for (int kk = 0; kk < BK; kk += KSTEP) {
            uint a[MT][4], b[NT][2];
#ifdef LDMATRIX
            // row addresses by lane L: A's 16 rows at k and k + 8; B's two 8-column tiles at k and k + 8
#define A_ROWS(L) (as + (wm + i * 16 + ((L) & 15)) * LD + kk + ((L) >> 4) * 8)
#define B_ROWS_KMAJOR(L) (bs + (kk + (((L) >> 3) & 1) * 8 + ((L) & 7)) * LDB + wn + j * 8 + ((L) >> 4) * 8)
#define B_ROWS(L) (bs + (wn + j * 8 + ((L) >> 4) * 8 + ((L) & 7)) * LD + kk + (((L) >> 3) & 1) * 8)
            #pragma unroll
            for (int i = 0; i < MT; ++i) LDSM(a[i], A_ROWS, false);
            #pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint r[4];
#ifdef B_KMAJOR
                LDSM(r, B_ROWS_KMAJOR, true);
#else
                LDSM(r, B_ROWS, false);
#endif
                b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
            }
#else
            #pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int r = wm + i * 16 + g;
#if defined(MMA_TF32)
                a[i][0] = CVT_FRAG(FRAG(as, r, kk + t));      a[i][1] = CVT_FRAG(FRAG(as, r + 8, kk + t));
                a[i][2] = CVT_FRAG(FRAG(as, r, kk + t + 4));  a[i][3] = CVT_FRAG(FRAG(as, r + 8, kk + t + 4));
#else
                a[i][0] = FRAG(as, r, kk + 2 * t);      a[i][1] = FRAG(as, r + 8, kk + 2 * t);
                a[i][2] = FRAG(as, r, kk + 2 * t + 8);  a[i][3] = FRAG(as, r + 8, kk + 2 * t + 8);
#endif
            }
            #pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int c = wn + j * 8 + g;
#if defined(B_KMAJOR) && defined(MMA_TF32)
                b[j][0] = CVT_FRAG(bs[(kk + t) * LDB + c]);   b[j][1] = CVT_FRAG(bs[(kk + t + 4) * LDB + c]);
#elif defined(B_KMAJOR)
                b[j][0] = (uint)bs[(kk + 2 * t) * LDB + c] | ((uint)bs[(kk + 2 * t + 1) * LDB + c] << 16);
                b[j][1] = (uint)bs[(kk + 2 * t + 8) * LDB + c] | ((uint)bs[(kk + 2 * t + 9) * LDB + c] << 16);
#elif defined(MMA_TF32)
                b[j][0] = CVT_FRAG(FRAG(bs, c, kk + t));      b[j][1] = CVT_FRAG(FRAG(bs, c, kk + t + 4));
#else
                b[j][0] = FRAG(bs, c, kk + 2 * t);      b[j][1] = FRAG(bs, c, kk + 2 * t + 8);
#endif
            }
#endif
            MMA_UNROLL
            for (int i = 0; i < MT; ++i)
                MMA_UNROLL
                for (int j = 0; j < NT; ++j)
                    MMA(acc[i][j], a[i], b[j], acc[i][j]);
        }
#if defined(ALIGNED) && !defined(ASYNC)
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + BK < K) {
            STORE_TILES();
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#elif !defined(ASYNC)
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NT; ++j)
            #pragma unroll
            for (int o = 0; o < 4; ++o) {
                const int m = m0 + wm + i * 16 + g + (o >> 1) * 8, n = n0 + wn + j * 8 + 2 * t + (o & 1);
                if (m < M && n < N) STORE1(GEMM_EPILOGUE((ACC_T)acc[i][j][o], m, n), (long)m * c_rs + n, C);
            }
}
