// Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11), the generator of
// Random123, curand and JAX. Bits depend only on (seed, counter), never on the device.
// Layout: 1-D; work-item g hashes counter (offset + g) with key (seed) into 4 uint32 words and
// writes PER_ITEM outputs (out[PER_ITEM*g + j]), bound-checked against n.
// Build options: T, IS_HALF, IS_BF16, USE_FP64 (common.cl) for the output; -DSCALAR=<float|double: type of low/high>
// -DKIND=<0 uniform, 1 normal, 2 integer>
//                -DPER_ITEM=<outputs per work-item>.

#include "common.cl"
#include "philox.cl"

__kernel void philox_fill(__global T *out, const long out_offset, const long n,
                          const uint seed_lo, const uint seed_hi, const ulong counter0,
                          const SCALAR low, const SCALAR high, const long int_low, const ulong int_range)
{
    const long g = get_global_id(0);
    const ulong ctr = counter0 + (ulong)g;
    const uint4 w = philox_block(ctr, seed_lo, seed_hi);
    uint words[4] = {w.x, w.y, w.z, w.w};
    __global T *dst = out + out_offset;
    const long base = (long)PER_ITEM * g;
#if KIND == 0
  #if defined(USE_FP64)
    // two 53-bit uniforms (NumPy's construction: 27 + 26 bits)
    for (int j = 0; j < 2; ++j) {
        if (base + j < n) {
            const ulong a = words[2 * j] >> 5, b = words[2 * j + 1] >> 6;
            const double u = ((double)a * 67108864.0 + (double)b) * 0x1.0p-53;
            dst[base + j] = low + (high - low) * u;
        }
    }
  #elif defined(IS_HALF)
    for (int j = 0; j < 4; ++j)
        if (base + j < n) {
            // 11 bits keep the value exact in half and strictly below 1
            const float u = (float)(words[j] >> 21) * 0x1.0p-11f;
            vstore_half((float)low + ((float)high - (float)low) * u, base + j, dst);
        }
  #elif defined(IS_BF16)
    for (int j = 0; j < 4; ++j)
        if (base + j < n) {
            // 8 bits keep the value exact in bfloat16 and strictly below 1
            const float u = (float)(words[j] >> 24) * 0x1.0p-8f;
            STORE_T(dst, base + j, (float)low + ((float)high - (float)low) * u);
        }
  #else
    for (int j = 0; j < 4; ++j)
        if (base + j < n) dst[base + j] = (float)low + ((float)high - (float)low) * u24(words[j]);
  #endif
#elif KIND == 1
  #if defined(USE_FP64)
    {
        const ulong a0 = words[0] >> 5, b0 = words[1] >> 6, a1 = words[2] >> 5, b1 = words[3] >> 6;
        const double u1 = ((double)a0 * 67108864.0 + (double)b0 + 1.0) * 0x1.0p-53;  // (0, 1]
        const double u2 = ((double)a1 * 67108864.0 + (double)b1) * 0x1.0p-53;
        const double r = sqrt(-2.0 * log(u1));
        const double t = 6.283185307179586 * u2;
        if (base < n) dst[base] = low + high * (r * cos(t));
        if (base + 1 < n) dst[base + 1] = low + high * (r * sin(t));
    }
  #else
    for (int j = 0; j < 2; ++j) {
        const float u1 = (float)((words[2 * j] >> 8) + 1u) * 0x1.0p-24f;  // (0, 1]
        const float u2 = u24(words[2 * j + 1]);
        const float r = sqrt(-2.0f * log(u1));
        const float t = 6.2831853071795865f * u2;
        const float z0 = (float)low + (float)high * (r * cos(t));
        const float z1 = (float)low + (float)high * (r * sin(t));
    #if defined(IS_HALF)
        if (base + 2 * j < n) vstore_half(z0, base + 2 * j, dst);
        if (base + 2 * j + 1 < n) vstore_half(z1, base + 2 * j + 1, dst);
    #elif defined(IS_BF16)
        if (base + 2 * j < n) STORE_T(dst, base + 2 * j, z0);
        if (base + 2 * j + 1 < n) STORE_T(dst, base + 2 * j + 1, z1);
    #else
        if (base + 2 * j < n) dst[base + 2 * j] = z0;
        if (base + 2 * j + 1 < n) dst[base + 2 * j + 1] = z1;
    #endif
    }
  #endif
#else
    // integers in [int_low, int_low + int_range): multiply-high of the random word by the range
  #if defined(IS_WIDE)
    for (int j = 0; j < 2; ++j)
        if (base + j < n) {
            const ulong x = ((ulong)words[2 * j] << 32) | (ulong)words[2 * j + 1];
            dst[base + j] = (T)(int_low + (long)mul_hi(x, int_range));
        }
  #else
    for (int j = 0; j < 4; ++j)
        if (base + j < n)
            dst[base + j] = (T)(int_low + (long)(((ulong)words[j] * int_range) >> 32));
  #endif
#endif
}
