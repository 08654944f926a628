// The argmax's order, shared by sampling.cl (greedy and the Gumbel-max draw) and gemm_gemv.cl (GEMV_ARGMAX:
// a decode step's greedy token picked by the language-model head's own launch), so both pick the same token.
#ifndef NETCL_ARGMAX_CL
#define NETCL_ARGMAX_CL

// an unsigned key with key(a) < key(b) exactly when a < b (for non-NaN floats)
inline uint order_key(float f) {
    const uint bits = as_uint(f);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// the order the argmax takes its values in: a float's order_key, with -0.0 equal to 0.0 and NaN above
// everything (the first NaN wins, as torch.argmax's)
inline uint argmax_key(float v) {
    return isnan(v) ? 0xFFFFFFFFu : order_key(v == 0.0f ? 0.0f : v);
}

// whether (key, index) beats the best so far (bk, bi): a larger key, or an equal key at a smaller index;
// index -1 (nothing) loses and is beaten by anything. A total order: any reduction order gives one answer.
inline int argmax_beats(const uint key, const int index, const uint bk, const int bi) {
    return index >= 0 && (bi < 0 || key > bk || (key == bk && index < bi));
}

#endif
