"""Where a composed batch's parts go (NOTE [ Composed batches ]): evenly spread choices of
batches, counted for any range without anything per batch."""

from __future__ import annotations

import math

import numpy as np

# How far from batches / phi the step of the extras' permutation is sought.
_STEP_SEARCH = 32


def golden_step(batches: int) -> int:
    """A step coprime with ``batches`` near ``batches / phi`` whose continued fraction
    ``step / batches`` has the smallest sum of partial quotients among its neighbours:
    that sum bounds how unevenly consecutive multiples of the step spread."""
    near = (math.isqrt(5 * batches * batches) - batches) // 2
    candidates = range(max(1, near - _STEP_SEARCH), min(batches, near + _STEP_SEARCH + 1))
    coprime = [step for step in candidates if math.gcd(step, batches) == 1] or [1]
    return min(coprime, key=lambda step: (_quotients(step, batches), abs(step - near), step))


def _quotients(a: int, b: int) -> int:
    """The sum of the partial quotients of the continued fraction of ``a / b``."""
    total = 0
    while a:
        total, a, b = total + b // a, b % a, a
    return total


def affine(alpha: int, start: int, modulus: int, count: int) -> np.ndarray:
    """``(start + alpha i) % modulus`` for ``i < count``, in blocks short enough for int64."""
    alpha %= modulus
    block = max(1, (1 << 62) // max(1, alpha))
    out = np.empty(count, dtype=np.int64)
    for lo in range(0, count, block):
        n = min(block, count - lo)
        out[lo : lo + n] = ((start + alpha * lo) % modulus + alpha * np.arange(n, dtype=np.int64)) % modulus
    return out


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a i + b) / m) for i < n)`` for ``a, b >= 0``, in O(log m) (ACL's floor_sum)."""
    total = 0
    while True:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b, m, a = top // m, top % m, a, m


def count_below(k: int, modulus: int, alpha: int, gamma: int, e: int) -> int:
    """How many ``i < k`` have ``(alpha i + gamma) % modulus < e`` (``0 <= gamma < modulus``,
    ``0 < e < modulus``): ``[x % m < e] = floor(x / m) - floor((x - e) / m)``."""
    return _floor_sum(k, modulus, alpha, gamma) - _floor_sum(k, modulus, alpha, gamma - e + modulus) + k
