"""Byte-level BPE training with incremental pair counts over unique pre-split chunks.

Each distinct chunk is stored once with its frequency as weight. ``pair -> weighted count`` and
``pair -> set of chunk ids`` are kept up to date; a merge rewrites only the chunks that contain the pair.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping

from tqdm.auto import tqdm


def _merge_pair(ids: list[int], left: int, right: int, new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of (left, right), scanning left to right, by new_id."""
    out: list[int] = []
    append = out.append
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == left and ids[i + 1] == right:
            append(new_id)
            i += 2
        else:
            append(ids[i])
            i += 1
    return out


def learn_merges(
    chunk_counts: Mapping[bytes, int],
    vocab: list[bytes],
    n_merges: int,
    *,
    progress: bool = False,
    verbose: bool = False,
) -> list[tuple[tuple[int, int], int]]:
    """Learn up to ``n_merges`` merges; append the new tokens' bytes to ``vocab`` in place.

    ``chunk_counts`` maps a pre-split chunk's UTF-8 bytes to how often it occurs. The count of a pair is
    ``sum(weight(chunk) * occurrences of the pair in chunk)`` with overlapping occurrences counted
    (``aaa`` holds ``aa`` twice), as in minbpe and Hugging Face.

    Choice of the merge: highest count; ties go to the smallest (left id, right id), i.e. the pair whose
    tokens were created first. This is what a min-heap of ``(-count, left, right)`` pops. Stale heap
    entries (the count has changed since the push) are skipped; every count change pushes a fresh entry.

    If the merged bytes already exist as a token (``ab+c`` vs ``a+bc``) the existing id is reused and the
    vocabulary does not grow (as Hugging Face does), so the loop runs until ``n_merges`` new tokens exist or
    no pair is left. Returns ``[((left, right), new_id), ...]`` in merge order.
    """
    words: list[list[int]] = []
    weights: list[int] = []
    for chunk, weight in chunk_counts.items():
        if len(chunk) > 1:
            words.append(list(chunk))
            weights.append(weight)
    counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for idx, ids in enumerate(words):
        weight = weights[idx]
        for pair in itertools.pairwise(ids):
            counts[pair] = counts.get(pair, 0) + weight
            bucket = where.get(pair)
            if bucket is None:
                where[pair] = {idx}
            else:
                bucket.add(idx)
    heap = [(-count, pair[0], pair[1]) for pair, count in counts.items()]
    heapq.heapify(heap)

    token_id = {token: i for i, token in enumerate(vocab)}
    merges: list[tuple[tuple[int, int], int]] = []
    grown = 0
    bar = tqdm(total=n_merges, desc="BPE merges", unit="merge", disable=not progress)
    while grown < n_merges and heap:
        neg_count, left, right = heapq.heappop(heap)
        pair = (left, right)
        if counts.get(pair, 0) != -neg_count:
            continue  # stale: a fresher entry for this pair is in the heap (or it is gone)
        merged = vocab[left] + vocab[right]
        new_id = token_id.get(merged)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            token_id[merged] = new_id
            grown += 1
            bar.update(1)
        merges.append((pair, new_id))
        if verbose:
            print(f"merge {len(merges)}: ({left}, {right}) -> {new_id} {merged!r} count {-neg_count}")

        delta: dict[tuple[int, int], int] = {}
        for idx in where.pop(pair):
            ids = words[idx]
            new_ids = _merge_pair(ids, left, right, new_id)
            words[idx] = new_ids
            weight = weights[idx]
            old_pairs = set()
            for p in itertools.pairwise(ids):
                delta[p] = delta.get(p, 0) - weight
                old_pairs.add(p)
            new_pairs = set()
            for p in itertools.pairwise(new_ids):
                delta[p] = delta.get(p, 0) + weight
                new_pairs.add(p)
            for p in old_pairs - new_pairs:
                if p != pair:
                    where[p].discard(idx)
            for p in new_pairs - old_pairs:
                bucket = where.get(p)
                if bucket is None:
                    where[p] = {idx}
                else:
                    bucket.add(idx)
        for p, change in delta.items():
            if change == 0:
                continue
            count = counts.get(p, 0) + change
            if count > 0:
                counts[p] = count
                heapq.heappush(heap, (-count, p[0], p[1]))
            else:
                counts.pop(p, None)
                bucket = where.get(p)
                if bucket is not None and not bucket:
                    del where[p]
    bar.close()
    return merges
