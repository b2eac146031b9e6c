"""One iteration of a ``StreamingDataset``: the samples of a worker's windows, in yield
order, decoded, with the count its ``state_dict()`` reads. NOTE [ A worker's garbage
collector ] says why a worker's first iteration freezes what it inherited.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from shardstream.dataset.bulk import WindowDecoding, decoded_columns, decoded_window
from shardstream.dataset.kinds import Reader
from shardstream.formats.base import SampleColumns
from shardstream.plan import Plan

__all__ = ["Iteration", "window_samples"]


# NOTE [ A worker's garbage collector ]
# A DataLoader worker forked from the training process inherits its heap: a few hundred
# thousand objects (torch, numpy, the user's model and data), each tracked by the cyclic
# garbage collector. A worker makes a dict for every sample, and once enough of them live
# at once (about a quarter of the objects that survived the parent's last full
# collection) the collector runs a full collection, which walks every tracked object, the
# inherited ones included. Walking them writes to their headers, so each of their pages
# is copied from the parent (copy on write): a costly pause of the worker's CPU, and the
# order="global" worker, which holds more samples at its peak than the local order's,
# meets it every epoch. So a worker's first iteration moves everything it inherited to the
# permanent generation (``gc.freeze()``, as Python's documentation advises for a process
# that forks without exec): its collections walk only what the worker made since, and
# the parent's pages stay shared. tools/bench_stream.py --only order measures the epoch.
# Once per process, so a persistent worker's later epochs collect their own garbage as
# ever. The price: cycles among the inherited objects that die in the worker are never
# collected there (reference counting still frees everything else); they were the
# parent's memory, shared, and a worker lives one epoch, or as long as the loader.
# (``lifecycle.freeze_inherited_heap`` does it, once per process.)
class Iteration:
    """One in-process iteration: its plan and how many samples it has taken, for
    ``state_dict()``; the count is read off the list iterator of the current window, so
    the hot path counts nothing per sample."""

    __slots__ = ("_base", "_iterator", "_size", "done", "plan")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.done = False
        self._base = self._size = 0
        self._iterator: Any = None

    def start_window(self, ordered: Collection[Any]) -> Iterator[Any]:
        """An iterator over ``ordered`` (the samples of a window, or their positions), which
        the window's samples are yielded in step with."""
        self._base += self._size
        self._size = len(ordered)
        self._iterator = iter(ordered)
        return self._iterator

    @property
    def count(self) -> int:
        """Samples taken so far (skipped ones included: they were consumed too)."""
        left = self._iterator.__length_hint__() if self._iterator is not None else 0
        return self._base + self._size - left


def window_samples(
    reader: Reader, windows: Iterator[Any], iteration: Iteration, decoding: WindowDecoding
) -> Iterator[Any]:
    """The samples of ``windows`` read by ``reader``, decoded and transformed as
    ``decoding`` says, counted by ``iteration``; the reader is closed at the end."""
    transform, bulk = decoding.transform, decoding.columns is not None
    try:
        for window, samples, holes in reader.stream(windows):  # in yield order
            if bulk and isinstance(samples, SampleColumns):  # NOTE [ Bulk decode ]
                positions = iteration.start_window(range(len(samples)))
                yield from decoded_columns(decoding, samples, positions, window, reader)
                continue
            listed = samples.samples() if isinstance(samples, SampleColumns) else samples
            del samples
            ordered = iteration.start_window(listed)
            del listed
            if not bulk and not holes:
                # The hot path: no Python code runs per sample but the caller's.
                yield from ordered if transform is None else map(transform, ordered)
            else:
                yield from decoded_window(decoding, ordered, window, reader)  # NOTE [ Bulk decode ]
        iteration.done = True
    finally:
        reader.close()
