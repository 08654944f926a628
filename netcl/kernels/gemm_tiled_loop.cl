// The tiled GEMM's k loop (gemm_tile.cl), included inside a kernel's body: tiles t = 0 .. ntiles-1, each a
// BK-deep slice of A's block rows (m0) and of B at block column TILE_N0(t), accumulated into acc[TM][TN].
// Double-buffered: while the work-group multiplies tile t out of one local buffer, each work-item holds its
// share of tile t+1 in registers, stores it to the other buffer, and one barrier per tile separates the
// phases. The includer defines, before the #include line:
//   GEMM_NTILES    the number of tiles (an int expression)
//   TILE_K0(t)     first k of tile t
//   TILE_N0(t)     first column of B of tile t
//   TILE_VEC(t)    with GVEC and not ALL_INNER: whether tile t (t may be ntiles) lies wholly inside the
//                  operands and is fetched 4-wide (uniform per work-group)
//   TILE_DONE(t)   a statement run after tile t's products (may read and reset acc); empty for the GEMM
// and has in scope: As, Bs (2 * BK * LDA_L and 2 * BK * LDB_L VEC_T), tid, tx, ty, m0, acc.
// A kernel file includes it once (netcl.kernels.source includes each file once per program).
    ACC_T ra[RA_N], rb[RB_N];   // this work-item's share of the next tile (scalar or 4-wide fetch)
    const int ntiles = GEMM_NTILES;
#if defined(GVEC) && defined(ALL_INNER)
    // the host saw that every tile is interior: no scalar path at all
    GEMM_TILED_FETCH_VEC(TILE_K0(0), TILE_N0(0));
    GEMM_TILED_STAGE_VEC(As, Bs);
    if (0)
#elif defined(GVEC)
    bool vec = TILE_VEC(0);   // tile 0 fetched 4-wide
    if (vec) {
        GEMM_TILED_FETCH_VEC(TILE_K0(0), TILE_N0(0));
        GEMM_TILED_STAGE_VEC(As, Bs);
    } else
#endif
    {
        GEMM_TILED_FETCH(TILE_K0(0), TILE_N0(0));
        GEMM_TILED_STAGE(As, Bs);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
#if defined(GVEC) && defined(ALL_INNER)
        const bool vec = t + 1 < ntiles;
        if (vec)
            GEMM_TILED_FETCH_VEC(TILE_K0(t + 1), TILE_N0(t + 1));
#elif defined(GVEC)
        vec = TILE_VEC(t + 1);   // tile t+1 lies wholly inside
        if (vec)
            GEMM_TILED_FETCH_VEC(TILE_K0(t + 1), TILE_N0(t + 1));
        else
#endif
#if !(defined(GVEC) && defined(ALL_INNER))
        if (t + 1 < ntiles)
            GEMM_TILED_FETCH(TILE_K0(t + 1), TILE_N0(t + 1));
#endif
        __local const VEC_T *as = As + cur * (BK * LDA_L);
        __local const VEC_T *bs = Bs + cur * (BK * LDB_L);
        GEMM_UNROLL(KU)
        for (int kk = 0; kk < BK; ++kk) {
            ACC_T a[TM], b[TN];
#pragma unroll
            for (int ci = 0; ci < TM / VW; ++ci) {
                const VEC_T v = as[kk * LDA_L + ci * TY + ty];
                UNPACK(v, a, ci * VW);
            }
#pragma unroll
            for (int cj = 0; cj < TN / VW; ++cj) {
                const VEC_T v = bs[kk * LDB_L + cj * TX + tx];
                UNPACK(v, b, cj * VW);
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
        TILE_DONE(t);
#ifdef GVEC
        if (vec)
            GEMM_TILED_STAGE_VEC(As + (cur ^ 1) * (BK * LDA_L), Bs + (cur ^ 1) * (BK * LDB_L));
#ifndef ALL_INNER
        else
#endif
#endif
#if !(defined(GVEC) && defined(ALL_INNER))
        if (t + 1 < ntiles)
            GEMM_TILED_STAGE(As + (cur ^ 1) * (BK * LDA_L), Bs + (cur ^ 1) * (BK * LDB_L));
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
    }
