"""Random permutations keyed by tuples of integers, the same on every machine.

NOTE [ Stable randomness ]
Every random choice of the plan comes from ``permutation(n, key)`` with ``key`` a tuple
of integers (seed, epoch, a tag, ...): never a global generator, ``hash()``, a time or a
pid. numpy promises stable streams for ``SeedSequence`` and the raw output of ``PCG64``,
but not for ``Generator.permutation/shuffle/integers``, so a permutation is built from
raw 64-bit words only: each word's low bits are replaced by its index, which makes all
keys distinct, so any correct sort gives the same order, and the sorted keys' low bits
are the permutation (an argsort without its index array). ``SeedSequence`` drops trailing zero words (``[0]`` and ``[0, 0]``
seed alike), so every key is encoded to a fixed number of 32-bit words per tag.

NOTE [ Nested chunk order ]
order="global" gives batch ``j`` of a window chunk ``p[j]`` of each lane (NOTE [ Global
order ]), and DataLoader worker ``w`` of ``W`` takes batches ``j = w, w + W, ...``. A
uniform permutation scatters a worker's chunks among the other workers', so every
worker's reads of a lane span (and fetch, and CRC-check) nearly all of it. ``p`` is
instead nested: ``p[j]`` is the rank of a key made of ``j``'s bits read from the lowest
up (the bit-reversal permutation), each bit flipped by a keyed bit of the node of a
binary tree that ``j``'s lower bits lead to. Every ``j`` of one residue class modulo
``2**k`` shares its low ``k`` bits, so its keys share their top ``k`` bits and its
chunks are one contiguous range: each worker's chunks of a lane in a window are
contiguous for every power-of-two ``W``, at any offset (a resumed epoch), and ``p``
depends on neither ``W`` nor ``R``. The flips (one bit per node, from the row's ``n``
words) choose among about ``2**(n - 1)`` such orders. The rank is counted level by
level, without a sort: a key bit of 1 puts ``j`` after the node's other subtree, whose
size is a count of a residue class below ``n``.
"""

from __future__ import annotations

import numpy as np
from numpy.random import PCG64, SeedSequence  # numpy loads its random module lazily: pay at import

TAG_SHARDS = 1  # the order of the shards in an epoch
TAG_WINDOW = 2  # the order of the samples in one window
TAG_GLOBAL = 3  # order="global": which chunk of a lane each global batch of a window takes
TAG_PASS = 4  # a mixture: the order of a stream's shards in one of its passes (NOTE [ Mixtures ])
TAG_COMPOSED = 5  # mix="stratified"/"per_stream": parts' seeds and places (NOTE [ Composed batches ])

_WORD = (1 << 32) - 1


def _entropy(key: tuple[int, ...]) -> list[int]:
    """Each part of ``key`` as two 32-bit words (two's complement modulo 2**64)."""
    words: list[int] = []
    for part in key:
        value = int(part) & ((1 << 64) - 1)
        words += [value & _WORD, value >> 32]
    return words


def random_words(n: int, key: tuple[int, ...]) -> np.ndarray:
    """``n`` raw 64-bit words (uint64) of the stream keyed by ``key``."""
    generator = PCG64(SeedSequence(_entropy(key)))
    return np.asarray(generator.random_raw(n), dtype=np.uint64)


def permutation(n: int, key: tuple[int, ...]) -> np.ndarray:
    """A permutation of ``range(n)`` (int64) keyed by ``key``; see NOTE [ Stable randomness ]."""
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    bits = (n - 1).bit_length()
    # 63 random bits as a non-negative int64 (numpy sorts int64 about twice as fast as
    # uint64), the low `bits` of them replaced by the index.
    keys = (random_words(n, key) >> np.uint64(1)).view(np.int64)
    keys >>= bits
    keys <<= bits
    keys |= np.arange(n, dtype=np.int64)
    keys.sort()
    keys &= (1 << bits) - 1
    return keys


def row_permutations(words: np.ndarray) -> np.ndarray:
    """Each row of ``words`` (uint64, 2-D, raw words of keyed streams) made a permutation
    of ``range(columns)`` as :func:`permutation` makes one: many small ones in one sort."""
    rows, n = words.shape
    if n <= 1:
        return np.zeros((rows, n), dtype=np.int64)
    bits = (n - 1).bit_length()
    keys = (words >> np.uint64(1)).view(np.int64)
    keys >>= bits
    keys <<= bits
    keys |= np.arange(n, dtype=np.int64)
    keys.sort(axis=1)
    keys &= (1 << bits) - 1
    return keys


def nested_permutations(words: np.ndarray, shared: np.ndarray | None = None, levels: int = 0) -> np.ndarray:
    """Each row of ``words`` (uint64, 2-D, raw words of keyed streams) made a permutation
    ``p`` of ``range(columns)`` under which, for every power of two ``W``, the indices of
    one residue class modulo ``W`` go to one contiguous range (NOTE [ Nested chunk order ]).
    With ``shared`` (words of the same shape), the flips of the top ``levels`` levels are
    ``shared``'s: rows made with the same ``shared`` put each residue class modulo
    ``2**levels`` in the same range (NOTE [ Lane groups ] in global_order.py)."""
    rows, n = words.shape
    signed = words.view(np.int64)
    common = signed if shared is None else shared.view(np.int64)
    index = np.arange(n, dtype=np.int64)
    # Level i of the tree: the node is j's low i bits (< 2**i < n: a column of the row,
    # whose bit i + 1 is its flip); j's key bit is bit i of j, flipped. A key bit of 1
    # ranks j after the node's other subtree: the j < n whose low i + 1 bits are the
    # node's then the flip, ceil((n - those bits) / 2**(i + 1)) of them (0 past n). So
    # j gains ``unflipped`` unless its node flips, then ``flipped``.
    depths = range((n - 1).bit_length())
    gains = []
    for level in depths:
        node, half = index & ((1 << level) - 1), 1 << level
        bit = (index >> level) & 1
        unflipped = bit * ((n - node + 2 * half - 1) >> (level + 1))
        flipped = (1 - bit) * ((n - node - half + 2 * half - 1) >> (level + 1))
        gains.append((node, unflipped, flipped - unflipped))
    out = np.zeros((rows, n), dtype=np.int64)
    out += sum((gain[1] for gain in gains), np.zeros(n, dtype=np.int64))
    for level, (node, _, change) in zip(depths, gains, strict=True):
        flips = (common if level < levels else signed)[:, node] >> (level + 1)
        flips &= 1
        flips *= change
        out += flips
    return out
