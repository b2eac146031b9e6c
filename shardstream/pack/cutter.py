"""Where one shard ends and the next begins, from sample sizes alone: pure, no I/O.

``ShardWriter`` and ``pack`` (one process or many) both cut with ``ShardCutter``, so
the same samples and options give the same shards whichever wrote them.

# NOTE [ Shard boundaries ]
# A sample goes into the current shard unless the shard already holds
# ``samples_per_shard`` samples, or the sample's bytes (``ShardFormat.sample_size``:
# exact for tar, an estimate for Parquet) would take the shard's samples past the
# budget (``shard_size`` less an empty shard's bytes); then a new shard starts with it.
# A sample larger than the budget on its own is an error. The rule looks only at sizes
# and counts, in sample order, so the cut is the same in one process or many.
# ShardWriter sizes a tar sample while encoding it: ``TarEncoder.write_within`` computes
# the same exact size and writes the sample only if it fits the room left
# (``ShardCutter.room``), so the hot path looks at each sample once.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardstream.errors import PackError, ShardstreamError


class SampleTooLarge(PackError):
    """A sample larger than a whole shard's budget; whoever cut it names the sample.

    ``size`` and ``budget`` are in bytes; ``position`` is the sample's index in the
    sizes given to ``ShardCutter.cut`` (``None`` from ``ShardCutter.check``).
    """

    size: int = 0
    budget: int = 0
    position: int | None = None


class ShardCutter:
    """The rule of NOTE [ Shard boundaries ], fed one sample size at a time, in order.

    ``budget`` and ``max_samples`` are ``PackOptions.limits()``. The cutter knows only
    the shard being cut: its ``count`` of samples, their ``nbytes``, and its ``room``.
    Before the first sample there is no shard (``room`` is -1): the first sample
    begins one.
    """

    __slots__ = ("budget", "count", "max_samples", "nbytes", "room")

    def __init__(self, budget: int, max_samples: int) -> None:
        self.budget = budget
        self.max_samples = max_samples
        self.count = 0  # samples of the shard being cut
        self.nbytes = 0  # and their bytes
        # The most bytes the next sample may take and still go into this shard;
        # -1 when none fits (no shard begun yet, or it holds max_samples samples).
        self.room = -1

    def check(self, size: int) -> None:
        """Refuse a sample that no shard can hold."""
        if size > self.budget:
            error = SampleTooLarge(f"a sample of {size} bytes is larger than a shard's {self.budget} bytes")
            error.size, error.budget = size, self.budget
            raise error

    def begin(self) -> None:
        """Begin a new shard, empty: the next sample fits it if ``check`` lets it."""
        self.count = 0
        self.nbytes = 0
        self.room = self.budget

    def keep(self, size: int, samples: int = 1) -> None:
        """Put the next sample (or ``samples`` samples), of ``size`` bytes, into this shard.

        The caller has seen that they fit: ``size`` is at most ``room`` (and for more
        than one sample, the shard has room for their count).
        """
        self.count += samples
        self.nbytes += size
        self.room = self.budget - self.nbytes if self.count < self.max_samples else -1

    def cut(self, sizes: Sequence[int | ShardstreamError], lo: int = 0, hi: int | None = None) -> list[int]:
        """Place the samples of ``sizes[lo:hi]`` in order: the positions of those that begin a shard.

        A size that is an error (met while sizing the sample) is raised when the cut
        reaches it, and a sample too large for any shard raises ``SampleTooLarge`` with
        its position, so an input fails the same way however it was sized.
        """
        hi = len(sizes) if hi is None else hi
        many = hi - lo
        if many > 1 and self.room >= 0 and self.count + many <= self.max_samples:
            try:  # the common case: all of them fit this shard
                total = sum(sizes[lo:hi])  # type: ignore[arg-type]  # TypeError on an error
            except TypeError:
                total = self.room + 1  # placed one at a time below, to raise the error in its place
            if total <= self.room:
                self.keep(total, many)
                return []
        begins = []
        keep = self.keep
        for i in range(lo, hi):
            size = sizes[i]
            if isinstance(size, ShardstreamError):
                raise size
            if size > self.room:  # the rule: it does not fit this shard, so it begins the next
                try:
                    self.check(size)
                except SampleTooLarge as error:
                    error.position = i
                    raise
                self.begin()
                begins.append(i)
            keep(size)
        return begins
