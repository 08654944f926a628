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
// registers in between; one barrier per k tile. LDMATRIX: fragments read with ldmatrix.x4 (four 8 x 8
// matrices of 16-bit values per instruction; .trans for the k-major B tile; TF32 A and n-major B as
// 8 x 4 matrices of 32-bit values) instead of one 32-bit local load per register.
//
// Defines: MMA_F16 | MMA_BF16 | MMA_TF32 (input kind), BM, BN, BK (block), WM, WN (warp patch), PAD, PADB
// (local row padding, elements), ASYNC, STAGES (the cp.async ring), SWIZZLE (0/1: XOR-swizzled unpadded
// tiles in the ring instead of padding), LDMATRIX, DBUF (0/1: fragments double-buffered in registers),
// GROUP_M (0: row-major block order; g > 1: column-major in groups of g block rows, for L2 reuse),
// DYN_LOCAL (0/1: tiles in a __local kernel argument `tiles` sized at launch instead of static arrays),
// MMA_EMULATE (run the same fragments through a local-memory emulation of mma: lets the kernel's index
// arithmetic be tested on any OpenCL device, e.g. PoCL and Oclgrind; cp.async becomes a plain copy and
// ldmatrix per-lane address arithmetic), plus the GEMM options of gemm_common.cl. Storage: MMA_F16 = half
// (IS_HALF), MMA_BF16 = bfloat16 bits, MMA_TF32 = float.
//
// The block (knobs, tile layouts, loaders' helpers, fragment loads) is gemm_mma_tile.cl and the k loop
// gemm_mma_loop.cl, which k-means' assignment on matrix units (kmeans_mma.cl) shares.

#include "gemm_mma_tile.cl"

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
#if DYN_LOCAL
// the tiles in dynamic local memory (a __local argument of RING * (A_TILE + B_TILE) LTYPEs, sized at
// launch): a driver may grant a work-group more of it than of static local memory (NVIDIA: 48 KB)
void gemm_mma(GEMM_ARGS, __local uint4 *tiles)
#else
void gemm_mma(GEMM_ARGS)
#endif
{
    // 16-byte aligned: tiles are written (and, with ASYNC/LDMATRIX, read) 16 bytes at a time
#if DYN_LOCAL
    __local LTYPE *As = (__local LTYPE *)tiles, *Bs = As + RING * A_TILE;
#elif defined(ASYNC)
    __local LTYPE As[STAGES * A_TILE] __attribute__((aligned(16)));  // stage s: A[m0 + r, k0 + k] at s * A_TILE + R_OFF(r, k)
    __local LTYPE Bs[STAGES * B_TILE] __attribute__((aligned(16)));
#else
    __local LTYPE As[A_TILE] __attribute__((aligned(16)));           // A[m0 + r, k0 + k] at R_OFF(r, k)
    __local LTYPE Bs[B_TILE] __attribute__((aligned(16)));
#endif
#ifdef MMA_EMULATE
    __local float scratch_a[WARPS_M * WARPS_N * 16 * KSTEP];
    __local float scratch_b[WARPS_M * WARPS_N * KSTEP * 8];
#endif
    GEMM_SPLIT_LOCAL;
    const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    MMA_BLOCK();
    MMA_ACC_ZERO();

#include "gemm_mma_loop.cl"

    MMA_STORE_ACC(wm, 16, wn);
}
