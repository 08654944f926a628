/* Shared by every kernel file (#include "common.cl"): the switches of netcl.kernels.dtype_defines and
 * the activation names of netcl.kernels.ACTIVATIONS.
 *   T, ACC     storage and arithmetic C types of the kernel's dtype
 *   IS_HALF    T is half: read with vload_half, written with vstore_half, computed in float
 *   IS_BF16    T is ushort holding a bfloat16 (the high half of a float32), computed in float
 *   USE_FP64   T is double (enables cl_khr_fp64)
 *   ACT        the fused activation: ACT_NONE, ACT_RELU, ACT_GELU (erf), ACT_GELU_TANH or ACT_SILU
 * LOAD_T(p, i) reads element i of a T buffer as ACC; STORE_T(p, i, v) writes ACC v there, rounded to
 * nearest even for half and bfloat16 (NaN stays NaN, infinities stay, subnormals as the format has them).
 * A kernel written with them takes every dtype of the table; netcl.kernels.program refuses bfloat16 for
 * a file that uses neither them nor IS_BF16. nc_bf16_to_float / nc_float_to_bf16 convert one value. */
#ifndef NETCL_COMMON_CL
#define NETCL_COMMON_CL
#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_GELU 2
#define ACT_GELU_TANH 3
#define ACT_SILU 4
#ifndef ACT
#define ACT ACT_NONE
#endif

#include "half.cl"

/* bfloat16 <-> float: half.cl's nc_bf2f (exact) and nc_f2bf (round to nearest even; the conversion
 * instruction on NVIDIA) */
#define nc_bf16_to_float nc_bf2f
#define nc_float_to_bf16 nc_f2bf

#if defined(IS_HALF) && defined(NC_NVIDIA)
#define LOAD_T(p, i) nc_h2f(((__global const ushort *)(p))[i])
#define STORE_T(p, i, v) (((__global ushort *)(p))[i] = nc_f2h(v))
#elif defined(IS_HALF)
#define LOAD_T(p, i) vload_half((i), (p))
/* vstore_half without a suffix rounds in the default mode, which OpenCL fixes to round to nearest even:
 * the same bits as _rte. NVIDIA's OpenCL gave half stores with _rte a quarter of the bandwidth of the
 * bfloat16 stores (bench/NOTES.md, mixed precision), which suggests a slow rounding path for them. */
#define STORE_T(p, i, v) vstore_half((v), (i), (p))
#elif defined(IS_BF16)
#define LOAD_T(p, i) nc_bf16_to_float((p)[i])
#define STORE_T(p, i, v) ((p)[i] = nc_float_to_bf16(v))
#else
#define LOAD_T(p, i) ((ACC)(p)[i])
#define STORE_T(p, i, v) ((p)[i] = (T)(v))
#endif
/* Work-groups that merge their partial results without another launch (the threadfence-reduction pattern):
 * each writes its partials through PART_STORE, then asks nc_last_arrival(count, n) (one work-item that wrote
 * every partial itself) or nc_group_last_arrival(count, n, flag) (every work-item of the group wrote some),
 * which is true for the last of the n work-groups sharing count: the others' partials are then complete and
 * read through PART_LOAD. count is a zeroed int that the last one resets for the next launch, so one buffer
 * per queue serves every launch and recorded replay (Queue.arrival_counts). Elsewhere the partials (floats)
 * move through 32-bit atomics, read from the device-wide coherent level and not a data race (Oclgrind
 * checks); on NVIDIA through plain stores and loads from L2 (nc_part_load below), ordered by the arrival's
 * fences on both sides (CUDA's threadfence reduction): volatile accesses and atomics are issued one after another (a 512 x 512 x 16384
 * bfloat16 split-K GEMM 2.6-6.5x slower than a separate reduction launch; the split decode attention's merge
 * of 63 splits 76 us more through atomics; bench/NOTES.md, seventh and tenth sessions). */
#ifdef NC_NVIDIA
#define PART_STORE(p, i, v) (((__global float *)(p))[i] = (float)(v))
#define PART_LOAD(p, i) nc_part_load((__global const float *)(p) + (i))
/* The last arrival's loads bypass the SM's L1 (ld.global.cg: cached in L2 only, the device-wide coherent
 * level): a plain load may hit an L1 line this SM read before the other work-groups' partials landed, since
 * neighbouring merges share lines (a batch norm's per-channel partials), and the fence does not invalidate
 * it (CUDA's threadfence example reads the partials through a volatile pointer for this). Unlike volatile,
 * the loads stay in flight together. asm volatile keeps them after the arrival's fence. */
inline float nc_part_load(__global const float *p)
{
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"((ulong)p) : "memory");
    return v;
}
#else
#define PART_STORE(p, i, v) atomic_xchg((volatile __global float *)(p) + (i), (float)(v))
#define PART_LOAD(p, i) as_float(atomic_or((volatile __global uint *)(p) + (i), 0u))
#endif

/* A fence at device scope: what a work-item wrote before it is visible device-wide before what it writes
 * after (release), and what it reads after sees what others released before (acquire); with a barrier
 * before it (a release) or after it (an acquire) it covers the whole work-group. NVIDIA (compute capability
 * 7.0 and later): PTX fence.acq_rel.gpu. NVIDIA's mem_fence(CLK_GLOBAL_MEM_FENCE) did not order a store
 * before a later flag for other work-groups: a chained batch norm backward's elementwise parts read their
 * channel's coefficients from before the launch (H100, bench/NOTES.md, thirty-second session). Elsewhere
 * OpenCL's mem_fence. */
#if defined(NC_NVIDIA) && NC_NVIDIA >= 70
#define NC_FENCE_DEVICE() asm volatile("fence.acq_rel.gpu;" ::: "memory")
#else
#define NC_FENCE_DEVICE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif

/* A hint that the line of global memory holding p is read soon: fetched into the L2 cache, nothing waits for
 * it and no register holds it (NVIDIA: PTX prefetch.global.L2; elsewhere OpenCL's prefetch of one byte). */
inline void nc_prefetch_l2(__global const uchar *p)
{
#ifdef NC_NVIDIA
    asm volatile("prefetch.global.L2 [%0];" :: "l"((ulong)p));
#else
    prefetch(p, 1);
#endif
}

/* One work-item's arrival at a count other work-groups wait on or merge by: what it (and, after a barrier,
 * its work-group) wrote is released device-wide first; returns the count before. */
inline int nc_arrive(__global int *count)
{
    NC_FENCE_DEVICE();
    return atomic_inc(count);
}

inline int nc_last_arrival(__global int *count, const int n)
{
    if (nc_arrive(count) != n - 1) return 0;
    NC_FENCE_DEVICE();
    atomic_xchg(count, 0);
    return 1;
}

/* One work-item of a work-group waits until *count >= at_least (a count other work-groups raise through
 * nc_arrive), then acquires what they released (for its work-group, after a barrier). NVIDIA (compute
 * capability 7.0 and later): acquire loads in the loop (PTX ld.acquire.gpu: L2, no read-modify-write queued at
 * the count's slice beside the increments awaited; the reads after it see what the arrivals released), where a
 * fence after the loop would also wait for every load the work-item issued before it (gemm_gemv.cl's chain
 * tiles issue their first weight loads before they wait); with NC_SPIN_NS > 0 each miss sleeps about that many
 * ns (nanosleep) before it reads again. Elsewhere an atomic read in a loop (NC_SPIN_LOAD on older NVIDIA: a
 * volatile load), then a fence. */
inline void nc_wait_at_least(__global int *count, const int at_least)
{
#if defined(NC_NVIDIA) && NC_NVIDIA >= 70
    for (;;) {
        int v;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"((ulong)count) : "memory");
        if (v >= at_least) return;
#if defined(NC_SPIN_NS) && NC_SPIN_NS > 0
        asm volatile("nanosleep.u32 %0;" :: "r"(NC_SPIN_NS));
#endif
    }
#else
#if defined(NC_NVIDIA) && defined(NC_SPIN_LOAD)
    for (;;) {
        int v;
        asm volatile("ld.volatile.global.s32 %0, [%1];" : "=r"(v) : "l"((ulong)count) : "memory");
        if (v >= at_least) break;
    }
#else
    while (atomic_or(count, 0) < at_least) {}
#endif
    NC_FENCE_DEVICE();
#endif
}

/* nc_last_arrival for a work-group whose work-items each stored partials: every work-item's stores ordered by
 * the barrier before the first work-item's device-scope fence and arrival (CUDA's grid sync: __syncthreads,
 * then one thread's __threadfence and atomic), and (uniform over the group) true for the last group, whose
 * work-items read after that work-item's acquiring fence and a barrier. flag: an int in local memory
 * (declared at the kernel's outermost scope). Every work-item must call it. */
inline int nc_group_last_arrival(__global int *count, const int n, __local int *flag)
{
    mem_fence(CLK_GLOBAL_MEM_FENCE);        // this work-item's partials are visible to work-item 0 ...
    barrier(CLK_GLOBAL_MEM_FENCE);          // ... and every work-item's
    if (get_local_id(0) == 0 && get_local_id(1) == 0 && get_local_id(2) == 0)
        *flag = nc_last_arrival(count, n);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!*flag) return 0;
    mem_fence(CLK_GLOBAL_MEM_FENCE);        // the last one's loads see the other work-groups' partials
    return 1;
}
#endif
