// Sorted segments: a stable counting sort of M integer keys in [0, K) on the device, so that a sum over the
// positions holding each key can run in increasing position order, the same on every run (the deterministic
// scatter_add and embedding backward of ops.movement; PyTorch's embedding backward sorts the same way).
// key(i) = keys[koff + i * kstride], i < M; a negative key counts from the end (key + K); a key still outside
// [0, K) is left out (no segment holds it). No atomics: every value is written by one work-item.
//
// segment_rank: global nblocks * SB, local SB. Block b holds positions b * SB .. b * SB + SB - 1, its keys in
//   local memory; rank[i] = how many earlier positions of the block hold i's key (a scan of the block's
//   keys: O(SB) per work-item), and the first position of each key in the block writes the block's count of
//   that key to hist[b * K + key] (hist zeroed before: the other entries stay 0). Reads keys; writes rank,
//   hist.
// segment_offsets: global K, one work-item per key k: hist[b * K + k] becomes the count of k in the blocks
//   before b (block order), and start[k] the count of k in all blocks. Reads and writes hist; writes start.
// segment_starts: one work-group of SCAN work-items (global = local = SCAN): start[0 .. K] becomes the
//   exclusive prefix sum of the counts start[0 .. K - 1] (start[K]: the number of positions kept). Work-item
//   t sums its run of ceil(K / SCAN) counts, work-item 0 scans the SCAN sums in local memory, then each
//   work-item writes its run's starts. Reads and writes start.
// segment_place: global M: order[start[key] + hist[b * K + key] + rank[i]] = i, so segment k,
//   order[start[k] .. start[k + 1] - 1], lists the positions of key k in increasing order. Reads keys, rank,
//   hist, start; writes order.
//
// Build options: -DIT=<key storage type: int or long>, SB (positions per block: segment_rank's local size,
// default 256), SCAN (segment_starts' local size, default 256).

#ifndef SB
#define SB 256
#endif
#ifndef SCAN
#define SCAN 256
#endif

inline int segment_key(__global const IT *keys, const long koff, const long kstride, const int i, const int K)
{
    long k = (long)keys[koff + (long)i * kstride];
    if (k < 0) k += K;
    return (k < 0 || k >= K) ? -1 : (int)k;
}

__kernel void segment_rank(__global const IT *keys, const long koff, const long kstride, const int M,
                           const int K, __global int *rank, __global int *hist)
{
    __local int block[SB];
    const int lid = get_local_id(0), b = get_group_id(0), i = b * SB + lid;
    const int key = i < M ? segment_key(keys, koff, kstride, i, K) : -1;
    block[lid] = key;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (key < 0) return;
    int before = 0;
    for (int j = 0; j < lid; ++j) before += block[j] == key;
    if (before == 0) {
        int count = 1;
        for (int j = lid + 1; j < SB; ++j) count += block[j] == key;
        hist[(long)b * K + key] = count;
    }
    rank[i] = before;
}

__kernel void segment_offsets(__global int *hist, __global int *start, const int K, const int nblocks)
{
    const int k = get_global_id(0);
    if (k >= K) return;
    int run = 0;
    for (int b = 0; b < nblocks; ++b) {
        const long at = (long)b * K + k;
        const int count = hist[at];
        hist[at] = run;
        run += count;
    }
    start[k] = run;
}

__kernel void segment_starts(__global int *start, const int K)
{
    __local int part[SCAN];
    const int t = get_local_id(0);
    const int per = (K + SCAN - 1) / SCAN;
    const int lo = min(K, t * per), hi = min(K, lo + per);
    int sum = 0;
    for (int k = lo; k < hi; ++k) sum += start[k];
    part[t] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t == 0) {
        int run = 0;
        for (int u = 0; u < SCAN; ++u) {
            const int count = part[u];
            part[u] = run;
            run += count;
        }
        start[K] = run;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int run = part[t];
    for (int k = lo; k < hi; ++k) {
        const int count = start[k];
        start[k] = run;
        run += count;
    }
}

__kernel void segment_place(__global const IT *keys, const long koff, const long kstride, const int M,
                            const int K, __global const int *rank, __global const int *hist,
                            __global const int *start, __global int *order)
{
    const int i = get_global_id(0);
    if (i >= M) return;
    const int key = segment_key(keys, koff, kstride, i, K);
    if (key < 0) return;
    order[start[key] + hist[(long)(i / SB) * K + key] + rank[i]] = i;
}
