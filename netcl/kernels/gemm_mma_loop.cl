// The matrix-unit GEMM's k loop (gemm_mma_tile.cl), included inside a kernel's body: tiles kt = 0 .. nk-1,
// each a BK-deep slice of A's block rows (m0) and of B's block columns (n0), through one of the three
// loaders (ASYNC: the cp.async ring; ALIGNED: 16-byte loads staged in registers; else element loads), the
// products accumulated into acc[MT][NT][4]. The includer may define, before the #include line (defaults:
// the GEMM's K loop):
//   GEMM_NTILES     the number of tiles (an int expression; default ceil(K / BK))
//   TILE_K0(kt)     first k of tile kt (default kt * BK)
//   TILE_B_OFF(kt)  elements added to B's addresses in tile kt (k-means: the center tile's first row;
//                   default 0): the edge tests stay those of the block columns n0 .. n0 + BN - 1
//   TILE_DONE(kt)   a statement run after tile kt's products (may read and reset acc; no barrier)
// and has in scope what gemm_mma.cl's kernel sets up: As, Bs, (scratch_a, scratch_b), tid, lane, warp,
// g, t, wm, wn, m0, n0, acc, M, N, K, A, B and the strides. A kernel file includes it once.
#ifndef GEMM_NTILES
#define GEMM_NTILES ((K + BK - 1) / BK)
#endif
#ifndef TILE_K0
#define TILE_K0(kt) ((kt) * BK)
#endif
#ifndef TILE_B_OFF
#define TILE_B_OFF(kt) 0
#endif
#ifndef TILE_DONE
#define TILE_DONE(kt)
#endif
    const int nk = GEMM_NTILES;
#if (defined(ASYNC) || defined(ALIGNED)) && (((BM * BK) % (VEC * THREADS)) || ((BN * BK) % (VEC * THREADS)))
#error "16-byte chunks of the BM x BK and BK x BN tiles must divide evenly among the work-group's threads"
#endif
#if defined(ASYNC)
    // every 16-byte chunk of a k tile: A's BM x BK, then B's (k-major rows along n, or rows along k). Each
    // thread's chunks keep their rows and columns from tile to tile: sources, destinations and edge
    // tests are set up once; a tile adds k0 (A, B rows along k) or k0 rows (k-major B).
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
    __global const MMA_IN_T *src_a[CH_A], *src_b[CH_B];
    int dst_a[CH_A], dst_b[CH_B], kc_a[CH_A], kc_b[CH_B], lim_a[CH_A], lim_b[CH_B];
    #pragma unroll
    for (int h = 0; h < CH_A; ++h) {
        const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;
        src_a[h] = A + (long)min(m0 + r, M - 1) * a_rs + kc;
        dst_a[h] = R_OFF(r, kc);
        kc_a[h] = kc;
        lim_a[h] = m0 + r < M ? K - kc : 0;     // elements left in the row from k0 = 0
    }
    #pragma unroll
    for (int h = 0; h < CH_B; ++h) {
#ifdef B_KMAJOR
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;
        src_b[h] = B + (long)k * b_ks + min(n0 + nc, N - 1);
        dst_b[h] = K_OFF(k, nc);
        kc_b[h] = k;                            // the chunk's k row: in range while k0 + k < K
        lim_b[h] = max(min(VEC, N - n0 - nc), 0);
#else
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;
        src_b[h] = B + (long)min(n0 + c, N - 1) * b_ns + kc;
        dst_b[h] = R_OFF(c, kc);
        kc_b[h] = kc;
        lim_b[h] = n0 + c < N ? K - kc : 0;
#endif
    }
#define ISSUE(kt)                                                                                       \
    do {                                                                                                \
        const int k0_ = TILE_K0(kt), s_ = (kt) % STAGES;                                                \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int left = min(VEC, lim_a[h] - k0_);                                                  \
            cp_async16(&As[s_ * A_TILE + dst_a[h]], left > 0 ? src_a[h] + k0_ : A,                       \
                       max(left, 0) * (int)sizeof(MMA_IN_T));                                            \
        }                                                                                               \
        ISSUE_B(k0_, s_, kt);                                                                           \
    } while (0)
#ifdef B_KMAJOR
#define ISSUE_B(k0_, s_, kt)                                                                            \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int left = k0_ + kc_b[h] < K ? lim_b[h] : 0;                                              \
        cp_async16(&Bs[s_ * B_TILE + dst_b[h]], left > 0 ? src_b[h] + (long)k0_ * b_ks + TILE_B_OFF(kt) : B, \
                   left * (int)sizeof(MMA_IN_T));                                                        \
    }
#else
#define ISSUE_B(k0_, s_, kt)                                                                            \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int left = min(VEC, lim_b[h] - k0_);                                                      \
        cp_async16(&Bs[s_ * B_TILE + dst_b[h]], left > 0 ? src_b[h] + k0_ + TILE_B_OFF(kt) : B,         \
                   max(left, 0) * (int)sizeof(MMA_IN_T));                                                \
    }
#endif
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
        __local const LTYPE *as = As + (kt % STAGES) * A_TILE, *bs = Bs + (kt % STAGES) * B_TILE;
#elif defined(ALIGNED)
    // register prefetch: the next k slice is in flight while the matrix units work on this one
#define CH_A (BM * BK / VEC / THREADS)
#define CH_B (BN * BK / VEC / THREADS)
    uint4 ra[CH_A], rb[CH_B];
#define FETCH(kt)                                                                                       \
    do {                                                                                                \
        const int k0f_ = TILE_K0(kt);                                                                   \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            const int gm = m0 + r, gk = k0f_ + kc;                                                      \
            ra[h] = gm < M ? load_vec(A, (long)gm * a_rs + gk, gk + VEC <= K, K - gk) : (uint4)(0);     \
        }                                                                                               \
        FETCH_B(k0f_, kt);                                                                              \
    } while (0)
#ifdef B_KMAJOR
#define FETCH_B(k0, kt)                                                                                 \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        const int gk = (k0) + k, gn = n0 + nc;                                                          \
        rb[h] = gk < K ? load_vec(B, (long)gk * b_ks + gn + TILE_B_OFF(kt), gn + VEC <= N, N - gn)       \
                       : (uint4)(0);                                                                    \
    }
#define STORE_B()                                                                                       \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, k = idx / (BN / VEC), nc = (idx % (BN / VEC)) * VEC;          \
        *(__local uint4 *)&Bs[K_OFF(k, nc)] = rb[h];                                                    \
    }
#else
#define FETCH_B(k0, kt)                                                                                 \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        const int gn = n0 + c, gk = (k0) + kc;                                                          \
        rb[h] = gn < N ? load_vec(B, (long)gn * b_ns + gk + TILE_B_OFF(kt), gk + VEC <= K, K - gk)       \
                       : (uint4)(0);                                                                    \
    }
#define STORE_B()                                                                                       \
    _Pragma("unroll")                                                                               \
    for (int h = 0; h < CH_B; ++h) {                                                                    \
        const int idx = tid + h * THREADS, c = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;          \
        *(__local uint4 *)&Bs[R_OFF(c, kc)] = rb[h];                                                    \
    }
#endif
#define STORE_TILES()                                                                                   \
    do {                                                                                                \
        _Pragma("unroll")                                                                           \
        for (int h = 0; h < CH_A; ++h) {                                                                \
            const int idx = tid + h * THREADS, r = idx / (BK / VEC), kc = (idx % (BK / VEC)) * VEC;      \
            *(__local uint4 *)&As[R_OFF(r, kc)] = ra[h];                                                \
        }                                                                                               \
        STORE_B();                                                                                      \
    } while (0)
    FETCH(0);
    STORE_TILES();
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kt = 0; kt < nk; ++kt) {
        if (kt + 1 < nk) FETCH(kt + 1);
        __local const LTYPE *as = As, *bs = Bs;
#else
    for (int kt = 0; kt < nk; ++kt) {
        const int k0 = TILE_K0(kt);
        // any strides: element loads, consecutive work-items along the operand's contiguous axis
        if (a_ks == 1) {
            for (int idx = tid; idx < BM * BK; idx += THREADS) {
                const int r = idx / BK, k = idx % BK, gm = m0 + r, gk = k0 + k;
                As[R_OFF(r, k)] = (gm < M && gk < K) ? to_lds(A, (long)gm * a_rs + gk) : (LTYPE)0;
            }
        } else {
            for (int idx = tid; idx < BM * BK; idx += THREADS) {
                const int r = idx % BM, k = idx / BM, gm = m0 + r, gk = k0 + k;
                As[R_OFF(r, k)] = (gm < M && gk < K) ? to_lds(A, (long)gm * a_rs + (long)gk * a_ks) : (LTYPE)0;
            }
        }
#ifdef B_KMAJOR
        for (int idx = tid; idx < BN * BK; idx += THREADS) {
            const int c = idx % BN, k = idx / BN, gn = n0 + c, gk = k0 + k;
            Bs[K_OFF(k, c)] = (gn < N && gk < K)
                              ? to_lds(B, (long)gk * b_ks + (long)gn * b_ns + TILE_B_OFF(kt)) : (LTYPE)0;
        }
#else
        for (int idx = tid; idx < BN * BK; idx += THREADS) {
            const int c = idx / BK, k = idx % BK, gn = n0 + c, gk = k0 + k;
            Bs[R_OFF(c, k)] = (gn < N && gk < K)
                              ? to_lds(B, (long)gk * b_ks + (long)gn * b_ns + TILE_B_OFF(kt)) : (LTYPE)0;
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        __local const LTYPE *as = As, *bs = Bs;
#endif
#if DBUF
        // fragments double-buffered in registers: step s + 1's are read while step s's mma issue
        uint a[2][MT][4], b[2][NT][2];
        {
            const int kk = 0;
            LOAD_A(a[0]);
            LOAD_B(b[0]);
        }
        MMA_UNROLL
        for (int s = 0; s < BK / KSTEP; ++s) {
            if (s + 1 < BK / KSTEP) {
                const int kk = (s + 1) * KSTEP;
                LOAD_A(a[(s + 1) & 1]);
                LOAD_B(b[(s + 1) & 1]);
            }
            MMA_ALL(a[s & 1], b[s & 1]);
        }
#else
        MMA_UNROLL
        for (int kk = 0; kk < BK; kk += KSTEP) {
            uint a[MT][4], b[NT][2];
            LOAD_A(a);
            LOAD_B(b);
            MMA_ALL(a, b);
        }
#endif
        TILE_DONE(kt);
#if defined(ALIGNED) && !defined(ASYNC)
        barrier(CLK_LOCAL_MEM_FENCE);
        if (kt + 1 < nk) {
            STORE_TILES();
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#elif !defined(ASYNC)
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
