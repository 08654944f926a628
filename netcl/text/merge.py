"""Rank-driven byte-pair merging of one pre-split chunk (tiktoken's `byte_pair_merge`, in Python).

Repeatedly merge the adjacent pair of parts whose concatenated bytes has the lowest rank; stop when no
adjacent concatenation is a token. Ties (equal lowest rank at several places) merge the leftmost first.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Rank of a concatenation that is not a token; larger than any real rank.
NOT_A_TOKEN = 1 << 62


def byte_pair_split(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Return the part boundaries ``[0, s1, ..., len(piece)]`` after merging ``piece`` by ``ranks``.

    ``pair_ranks[i]`` is the rank of ``parts[i] + parts[i+1]``. Each step finds the minimum (leftmost on
    ties) in C via ``min``/``list.index``, deletes one boundary and recomputes only the two neighbouring
    pair ranks, so a chunk of n bytes costs O(n^2) in the worst case and O(n) list work per merge; chunks
    from a pre-split pattern are short, so this beats a heap in Python.
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
