// GEMM for CPU devices (PoCL and other CPU OpenCL drivers): C = epilogue(A @ B), see gemm_common.cl.
// Layout: global (ceil(N/NB), ceil(M/MB), batch), local (1, 1, 1): one work-item owns an MB x NB block
// of C and computes it alone, without barriers. For each chunk of KC values of k it packs B's KC x NB
// block into local scratch as NB/VN panels of KC x VN (zero-padded past N; a plain vector copy when B's
// columns are contiguous), then runs a register-blocked micro-kernel: RM rows x VN columns of C held in
// RM vectors of VN floats, one vector FMA per row per k, A's values broadcast straight from global
// memory (row indices past M are clamped, their results discarded). Partial sums of a block live in a
// local MB x NB scratch between K chunks; the last chunk applies the epilogue and writes C.
// Reads A, B (, bias, residual); writes C. Local scratch: (KC*NB + MB*NB (+ KC*MB)) accumulator values.
// Tuning knobs:
//   MB  rows of C per work-item (default 64)
//   NB  columns of C per work-item, a multiple of VN (default 64)
//   KC  k values per cache block; B's packed KC x VN panel should fit in L1 (default 256)
//   RM  rows of the register block (default 6)
//   VN  columns of the register block = vector width: 4, 8 or 16 (default 16)
// Layout flags (set by the host): B_NCONTIG when B's columns are contiguous (b_ns == 1), B_KCONTIG
// when B's k is (b_ks == 1: a transposed view such as linear's weight); A_MCONTIG when A's rows
// are contiguous (a_rs == 1): A's block is then packed k-major into local scratch too.
// ROWSUM_A (unbatched launches only): the work-groups of the first column block also write the row
// sums of A, rowsum[m] = sum_k A[m, k], into the `bias` buffer (at bias_off, stride bias_stride),
// which is then an output and not added to C (HAS_BIAS must be off). This is a linear layer's bias
// gradient (A = g^T) computed in the weight-gradient launch instead of a reduction launch of its own.

#include "gemm_common.cl"

#ifndef MB
#define MB 64
#endif
#ifndef NB
#define NB 64
#endif
#ifndef KC
#define KC 256
#endif
#ifndef RM
#define RM 6
#endif
#ifndef VN
#define VN 16
#endif

#define VT GEMM_CAT(ACC, VN)

// No OpenCL library call here takes or returns a VT when VN * sizeof(ACC_T) is 64 bytes (float16,
// double8): PoCL 3.0 (LLVM 14) on AVX-512 CPUs that LLVM 14 does not know (AMD Zen 4, "znver3" to it)
// links its AVX-512 kernel library into code generated for a CPU without AVX-512, and a 512-bit vector
// passed to or returned from a library function is then miscompiled or aborts LLVM. So a VN-wide load
// is assembled from 4-wide ones, and lanes are read through a union; plain vector arithmetic is fine.
#if VN == 4
#define LOAD_VT(p) LOADV(4, 0, p)
#elif VN == 8
#define LOAD_VT(p) ((VT)(LOADV(4, 0, p), LOADV(4, 1, p)))
#elif VN == 16
#define LOAD_VT(p) ((VT)(LOADV(4, 0, p), LOADV(4, 1, p), LOADV(4, 2, p), LOADV(4, 3, p)))
#else
#error "VN must be 4, 8 or 16"
#endif
typedef union { VT v; ACC_T s[VN]; } vt_lanes;

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_cpu(GEMM_ARGS)
{
    // vector-typed scratch: aligned, so the hot loop reads it with plain vector loads (no vloadn calls)
    __local VT Bp[KC * (NB / VN)];
    __local VT Cp[MB * (NB / VN)];
#ifdef A_MCONTIG
    __local ACC_T Ap[KC * MB];  // A's block, k-major (A is a transposed view: columns contiguous)
#endif
    const int n0 = get_group_id(0) * NB;
    const int m0 = get_group_id(1) * MB;
    GEMM_SELECT_BATCH(get_group_id(2));
    const int mlen = min(MB, M - m0);
    const int nlen = min(NB, N - n0);
    const int npanels = (nlen + VN - 1) / VN;
#ifdef ROWSUM_A
    __local ACC_T Rs[MB];  // running row sums of A's block (first column block only)
    const bool do_rowsum = get_group_id(0) == 0;
#endif

    for (int k0 = 0; k0 < K || k0 == 0; k0 += KC) {
        const int kl = min(KC, K - k0);
        const bool first = k0 == 0;
        const bool last = k0 + KC >= K;

        // pack B[k0 : k0+kl, n0 : n0+nlen] as panels of kl x VN
        for (int p = 0; p < npanels; ++p) {
            const int n = n0 + p * VN;
            __local VT *dstv = Bp + p * KC;
            __local ACC_T *dst = (__local ACC_T *)dstv;
            __global const STORE_T *src = B + k0 * b_ks + n * b_ns;
            if (n + VN <= N) {
#ifdef B_NCONTIG
                for (int k = 0; k < kl; ++k)
                    dstv[k] = LOAD_VT(src + k * b_ks);
#elif defined(B_KCONTIG)
                // B is a transposed view (e.g. linear's weight): each column is contiguous along k
                for (int j = 0; j < VN; ++j) {
                    __global const STORE_T *col = src + j * b_ns;
                    for (int k = 0; k < kl; ++k)
                        dst[k * VN + j] = (ACC_T)LOAD1(k, col);
                }
#else
                for (int k = 0; k < kl; ++k)
                    for (int j = 0; j < VN; ++j)
                        dst[k * VN + j] = (ACC_T)LOAD1(k * b_ks + j * b_ns, src);
#endif
            } else {
                const int valid = N - n;
                for (int k = 0; k < kl; ++k)
                    for (int j = 0; j < VN; ++j)
                        dst[k * VN + j] = j < valid ? (ACC_T)LOAD1(k * b_ks + j * b_ns, src) : (ACC_T)0;
            }
        }

#ifdef A_MCONTIG
        for (int k = 0; k < kl; ++k) {
            __global const STORE_T *src = A + (k0 + k) * a_ks + m0;
            for (int mm = 0; mm < mlen; ++mm) Ap[k * MB + mm] = (ACC_T)LOAD1(mm, src);
        }
#endif
#ifdef ROWSUM_A
        if (do_rowsum) {
            for (int mm = 0; mm < mlen; ++mm) {
                ACC_T s = first ? (ACC_T)0 : Rs[mm];
#ifdef A_MCONTIG
                for (int k = 0; k < kl; ++k) s += Ap[k * MB + mm];
#else
                __global const STORE_T *row = A + (m0 + mm) * a_rs + k0 * a_ks;
                for (int k = 0; k < kl; ++k) s += (ACC_T)LOAD1(k * a_ks, row);
#endif
                Rs[mm] = s;
                if (last) STORE1(s, (m0 + mm) * bias_stride, (__global STORE_T *)bias);
            }
        }
#endif

        for (int p = 0; p < npanels; ++p) {
            const int n = n0 + p * VN;
            __local const VT *panel = Bp + p * KC;
            for (int i = 0; i < mlen; i += RM) {
#ifdef A_MCONTIG
                __local const ACC_T *arow[RM];
#define A_AT(r, k) arow[r][(k) * MB]
#else
                __global const STORE_T *arow[RM];
#define A_AT(r, k) (ACC_T)LOAD1((k) * a_ks, arow[r])
#endif
                VT acc[RM];
#pragma unroll
                for (int r = 0; r < RM; ++r) {
#ifdef A_MCONTIG
                    arow[r] = Ap + min(i + r, mlen - 1);
#else
                    arow[r] = A + min(m0 + i + r, M - 1) * a_rs + k0 * a_ks;
#endif
                    acc[r] = first ? (VT)0 : Cp[min(i + r, MB - 1) * (NB / VN) + p];
                }
                for (int k = 0; k < kl; ++k) {
                    const VT bv = panel[k];
#pragma unroll
                    for (int r = 0; r < RM; ++r)
                        acc[r] += (VT)(A_AT(r, k)) * bv;
                }
                if (!last) {
#pragma unroll
                    for (int r = 0; r < RM; ++r)
                        if (i + r < MB) Cp[(i + r) * (NB / VN) + p] = acc[r];
                } else {
                    const int rows = min(RM, mlen - i);
                    const int cols = min(VN, N - n);
#pragma unroll
                    for (int r = 0; r < RM; ++r) {
                        if (r >= rows) break;
                        vt_lanes lanes;
                        lanes.v = acc[r];
                        const ACC_T *vals = lanes.s;
                        const int m = m0 + i + r;
                        for (int j = 0; j < cols; ++j) {
                            STORE1(GEMM_EPILOGUE(vals[j], m, n + j), m * c_rs + n + j, C);
                        }
                    }
                }
            }
        }
    }
}
