// The rotation of one rotary-embedding pair, shared by rope.cl's kernels and the decode attention that rotates
// q and k itself (attention_gpu.cl, ROPE_CACHE), so that every path gives the same bits:
//   first = x1 cos - x2 sn,   second = x2 cos + x1 sn,
// each as one fma over a rounded product. The explicit fma leaves a compiler nothing to contract differently
// under different build options (-cl-mad-enable in one program, not in the other).
// Pairing (PAIRING): ROPE_HALF pairs x[i] with x[i + D/2] (GPT-NeoX, Hugging Face Llama's rotate_half);
// ROPE_INTERLEAVED pairs x[2i] with x[2i + 1] (Meta's original Llama, GPT-J).
// Build options: ACC (common.cl).
#ifndef NETCL_ROPE_COMMON_CL
#define NETCL_ROPE_COMMON_CL

#define ROPE_HALF 1
#define ROPE_INTERLEAVED 2

inline ACC rope_first(const ACC x1, const ACC x2, const ACC c, const ACC sn)
{
    return fma(x1, c, -(x2 * sn));
}

inline ACC rope_second(const ACC x1, const ACC x2, const ACC c, const ACC sn)
{
    return fma(x2, c, x1 * sn);
}

#endif
