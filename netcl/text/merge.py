"""Rank-driven byte-pair merging of one pre-split piece (tiktoken's `byte_pair_merge`, in Python).

Repeatedly merge the adjacent pair of parts whose concatenated bytes has the lowest rank; stop when no
adjacent concatenation is a token. Ties (equal lowest rank at several places) merge the leftmost first.
Short pieces use a linear scan; long ones a priority queue, so one long piece costs O(n log n), not O(n^2).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

#: Rank of a concatenation that is not a token; larger than any real rank.
NOT_A_TOKEN = 1 << 62

#: Pieces shorter than this many bytes use the linear scan; the queue wins above 24-48 bytes (measured with
#: cl100k ranks on repeated words and random letters).
SCAN_MAX_BYTES = 32


def byte_pair_split(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Return the part boundaries ``[0, s1, ..., len(piece)]`` after merging ``piece`` by ``ranks``.

    Both strategies give the same boundaries; which one runs depends only on the length.
    """
    if len(piece) < SCAN_MAX_BYTES:
        return scan_split(piece, ranks)
    return queue_split(piece, ranks)


def scan_split(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Linear-scan merging: O(n) per merge, so O(n^2) per piece; fastest for short pieces.

    ``pair_ranks[i]`` is the rank of ``parts[i] + parts[i+1]``. Each step finds the minimum (leftmost on
    ties) in C via ``min``/``list.index``, deletes one boundary and recomputes only the two neighbouring
    pair ranks.
    """
    get = ranks.get
    starts = list(range(len(piece) + 1))
    pair_ranks = [get(piece[i : i + 2], NOT_A_TOKEN) for i in range(len(piece) - 1)]
    while pair_ranks:
        lowest = min(pair_ranks)
        if lowest == NOT_A_TOKEN:
            break
        i = pair_ranks.index(lowest)
        # parts i and i+1 become one: drop the boundary between them and the pair rank that joined them.
        del starts[i + 1]
        del pair_ranks[i]
        if i < len(pair_ranks):
            pair_ranks[i] = get(piece[starts[i] : starts[i + 2]], NOT_A_TOKEN)
        if i > 0:
            pair_ranks[i - 1] = get(piece[starts[i - 1] : starts[i + 1]], NOT_A_TOKEN)
    return starts


def queue_split(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Priority-queue merging over a doubly linked list of parts: O(n log n) for a piece of n bytes.

    A part is named by the byte offset where it starts; ``after[s]`` / ``before[s]`` link the parts and
    ``pair_rank[s]`` is the rank of part ``s`` joined to the next one (None: not a token, or ``s`` is no
    longer a part start). Candidate pairs wait in a queue ordered by (rank, start), the order tiktoken's
    scan picks them in. Merging drops the right part and recomputes the two pairs that now touch the merged
    part; the queue is never searched for the entries that made stale: an entry whose rank no longer
    matches ``pair_rank`` is skipped when it comes out.

    The queue is two-level, which is what makes it fast in Python: a heap of distinct ranks, and per rank
    a list of starts, sorted when that rank becomes the lowest. A merge of rank r in a trained vocabulary
    almost always makes pairs of rank > r, which are plain appends to their lists. A pair of rank <= r
    (possible: ``ab+c`` may be a token ranked below ``bc``) is the global minimum, or ties with the
    current list, so it goes to a small (rank, start) heap that is drained, in order, before the next
    start of the current list.
    """
    n = len(piece)
    get = ranks.get
    after = list(range(1, n + 2))
    before = list(range(-1, n))
    pair_rank: list[int | None] = [get(piece[i : i + 2]) for i in range(n - 1)]
    pair_rank.append(None)
    lists: dict[int, list[int]] = {}
    for start, rank in enumerate(pair_rank):
        if rank is not None:
            waiting = lists.get(rank)
            if waiting is None:
                lists[rank] = [start]
            else:
                waiting.append(start)
    lowest_ranks = list(lists)
    heapq.heapify(lowest_ranks)
    urgent: list[tuple[int, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    current = 0

    def queue(start: int, rank: int) -> None:
        if rank <= current:
            heappush(urgent, (rank, start))
            return
        waiting = lists.get(rank)
        if waiting is None:
            lists[rank] = [start]
            heappush(lowest_ranks, rank)
        else:
            waiting.append(start)

    def merge(left: int) -> None:
        # Part `left` absorbs the part after it; then the pairs on both sides of the merged part change.
        right = after[left]
        following = after[right]
        after[left] = following
        before[following] = left
        pair_rank[right] = None
        if following < n:
            rank = pair_rank[left] = get(piece[left : after[following]])
            if rank is not None:
                queue(left, rank)
        else:
            pair_rank[left] = None
        previous = before[left]
        if previous >= 0:
            rank = pair_rank[previous] = get(piece[previous:following])
            if rank is not None:
                queue(previous, rank)

    def drain(limit: tuple[int, int] | None) -> None:
        while urgent and (limit is None or urgent[0] < limit):
            rank, start = heappop(urgent)
            if pair_rank[start] == rank:
                merge(start)

    while lowest_ranks:
        current = heappop(lowest_ranks)
        starts = lists.pop(current)
        starts.sort()
        for left in starts:
            if urgent:
                drain((current, left))
            if pair_rank[left] != current:
                continue  # stale: the pair at `left` changed after this entry was queued
            # merge(left), written out: this loop does nearly every merge of a long piece and the calls
            # cost 5-8% there. `lists` holds only ranks above `current` (lower ones were popped, and
            # queue() sends those to `urgent`), so a pair whose rank has a list is appended directly.
            right = after[left]
            following = after[right]
            after[left] = following
            before[following] = left
            pair_rank[right] = None
            if following < n:
                rank = pair_rank[left] = get(piece[left : after[following]])
                if rank is not None:
                    if (waiting := lists.get(rank)) is not None:
                        waiting.append(left)
                    else:
                        queue(left, rank)
            else:
                pair_rank[left] = None
            previous = before[left]
            if previous >= 0:
                rank = pair_rank[previous] = get(piece[previous:following])
                if rank is not None:
                    if (waiting := lists.get(rank)) is not None:
                        waiting.append(previous)
                    else:
                        queue(previous, rank)
        drain(None)

    boundaries = [0]
    start = 0
    while start < n:
        start = after[start]
        boundaries.append(start)
    return boundaries
