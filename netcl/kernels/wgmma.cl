// Hopper's warpgroup matrix units from OpenCL C, shared by gemm_wgmma.cl and attention_mma.cl (MMA_WG).
// NVIDIA's OpenCL compiler targets plain sm_90 and its ptxas refuses the sm_90a instructions (wgmma), so they
// are written behind the comment prefix "//NCWG " (NCW): the compiler passes inline asm through with its
// operands filled in, and netcl.core.ptx uncomments them and raises the PTX's target to sm_90a before the
// driver builds the program from that PTX. Under MMA_EMULATE the fences and the commit are no-ops (the
// includer emulates the products from the same local tiles and descriptors).
#ifndef NETCL_WGMMA_CL
#define NETCL_WGMMA_CL

#define NCW(x) "//NCWG " x
#define WG_STR2(x) #x
#define WG_STR(x) WG_STR2(x)

// a tile's swizzle: the 16-byte chunk at byte L (from a 1024-byte aligned start) lives at
// L ^ (((L >> 7) & (w / 16 - 1)) << 4), w the swizzle width (32, 64 or 128 bytes), which the units undo
inline uint swizzle(const uint L, const uint w) { return L ^ (((L >> 7) & (w / 16 - 1)) << 4); }
#define SWZ_MODE(w) ((w) == 128 ? 1 : (w) == 64 ? 2 : 3)   // the descriptor's bits 62-63

// the shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte units), swizzle
inline ulong wg_desc(const uint addr, const uint lbo, const uint sbo, const uint mode) {
    return (ulong)((addr >> 4) & 0x3fffu) | ((ulong)((lbo >> 4) & 0x3fffu) << 16)
           | ((ulong)((sbo >> 4) & 0x3fffu) << 32) | ((ulong)mode << 62);
}

#ifdef MMA_EMULATE
#define FENCE_ASYNC()
#define WG_FENCE()
#define WG_COMMIT()
#else
// cp.async writes through the generic proxy; wgmma reads through the async proxy
#define FENCE_ASYNC() asm volatile(NCW("fence.proxy.async.shared::cta;") ::: "memory")
#define WG_FENCE() asm volatile(NCW("wgmma.fence.sync.aligned;") ::: "memory")
#define WG_COMMIT() asm volatile(NCW("wgmma.commit_group.sync.aligned;") ::: "memory")
#endif

#endif
