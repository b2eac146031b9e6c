"""Paced start: a process's first requests wait for a token, so a whole job stays under a rate.

# NOTE [ Paced start ]
# A job of R ranks with W DataLoader workers each is R x W readers that start in the same
# second, and each sends its first requests (the manifest, its first sidecars, its first
# data) at once: a burst that an object store answers with 503 SlowDown or 429 (S3 serves
# a few thousand GETs per second on a prefix before it throttles). So a reader's first
# ``StartPacing.requests`` requests go through a token bucket of its process, filled at
# ``rate / processes`` tokens per second, where ``rate`` is the job's budget of requests
# per second and ``processes`` the readers that share it (world size x workers): together
# they stay under ``rate``, whatever the job's size. The bucket holds one token at most,
# so a reader that waited never sends a burst; and its first token comes at a uniformly
# random moment of its first interval (the jitter), so readers that start together
# spread over that interval instead of all asking at its start, and each keeps its own
# phase afterwards. After its first requests a reader is not paced: its steady reads are
# bounded by its read budget and concurrency, and a throttled one is retried with backoff
# (NOTE [ One retry layer ] in retry.py). Local files are never paced.
#
# The bucket belongs to the process, not to a Storage: the sources of a mixture, and every
# Storage of one process paced alike, share it (``gate``). The jitter only decides when a
# request goes, never what is read, so its generator is seeded by the OS, not by a key.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shardstream.errors import UsageError
from shardstream.lifecycle import PerProcess

# Requests per second for a whole job: below the GETs S3 serves on one prefix before it
# answers 503 SlowDown, with room for what other jobs send.
DEFAULT_START_RATE = 3500.0
# A reader's first requests, paced: its manifest, first sidecars and first data, and their retries.
START_REQUESTS = 16


@dataclass(frozen=True, slots=True)
class StartPacing:
    """How a process's first requests are paced (NOTE [ Paced start ]): ``rate`` requests
    per second for the whole job, shared by ``processes`` readers (world size x workers),
    for the first ``requests`` requests of each."""

    rate: float = DEFAULT_START_RATE
    processes: int = 1
    requests: int = START_REQUESTS

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int | float):
            raise UsageError(f"start_rate must be a number of requests per second, not {self.rate!r}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise UsageError(f"start_rate must be > 0 requests per second (None: not paced), not {self.rate}")
        if isinstance(self.processes, bool) or not isinstance(self.processes, int) or self.processes < 1:
            raise UsageError(f"StartPacing.processes must be an integer >= 1, not {self.processes!r}")
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or self.requests < 0:
            raise UsageError(f"StartPacing.requests must be an integer >= 0, not {self.requests!r}")

    @property
    def per_process(self) -> float:
        """Requests per second of one reader while it starts."""
        return self.rate / self.processes


class TokenBucket:
    """Tokens at ``rate`` per second, at most ``burst`` held; the first at a uniformly
    random moment of the first interval (NOTE [ Paced start ]). ``reserve`` takes the next
    token and says how long to wait for it: its caller sleeps, not the bucket, so a test
    runs it on its own clock."""

    def __init__(
        self,
        rate: float,
        *,
        burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if not (rate > 0 and math.isfinite(rate)) or not burst >= 1:
            raise UsageError(f"a token bucket needs rate > 0 and burst >= 1, not {rate}, {burst}")
        draw = rng if rng is not None else random.Random().random
        self.interval = 1.0 / rate
        self.burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._next = clock() + draw() * self.interval  # when the next token is there

    def reserve(self) -> float:
        """Take the next token: seconds until it is there (0: now)."""
        with self._lock:
            now = self._clock()
            # a bucket left idle holds ``burst`` tokens at most: the next is never older than that
            due = max(self._next, now - (self.burst - 1.0) * self.interval)
            self._next = due + self.interval
        return max(0.0, due - now)


@dataclass(slots=True)
class StartGate:
    """A process's paced start: each of its first ``left`` requests waits for a token."""

    bucket: TokenBucket
    left: int
    sleep: Callable[[float], object] = time.sleep
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, pacing: StartPacing) -> StartGate:
        return cls(TokenBucket(pacing.per_process), pacing.requests)

    @property
    def open(self) -> bool:
        """Whether requests go unpaced now (the start is over)."""
        return self.left <= 0

    def admit(self) -> float:
        """Wait for this request's turn, if the start is not over: the seconds waited."""
        if self.left <= 0:  # read without the lock: once over, the start stays over
            return 0.0
        with self._lock:
            if self.left <= 0:
                return 0.0
            self.left -= 1
        wait = self.bucket.reserve()
        if wait > 0:
            self.sleep(wait)
        return wait


class _Gates:
    """This process's gates, one per pacing (made anew in a fork child: NOTE [ Per-process state ])."""

    def __init__(self) -> None:
        self.made: dict[StartPacing, StartGate] = {}
        self.lock = threading.Lock()

    def of(self, pacing: StartPacing) -> StartGate:
        found = self.made.get(pacing)  # every request asks: no lock once the gate is made
        if found is not None:
            return found
        with self.lock:
            found = self.made.get(pacing)
            if found is None:
                found = self.made[pacing] = StartGate.of(pacing)
            return found


_GATES = PerProcess(_Gates)


def gate(pacing: StartPacing) -> StartGate:
    """This process's gate for ``pacing``: every Storage of the process paced alike shares it."""
    return _GATES.get().of(pacing)
