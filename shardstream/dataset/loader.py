"""``DataLoader``: torch's DataLoader with an exact, elastic ``state_dict()``.

# NOTE [ Exact resume through the DataLoader ]
# All ranks step in lockstep, so what an epoch has consumed follows from one number: the
# batches this loader has yielded in the main process since the epoch's iterator began
# (torch counts them in ``_num_yielded``). ``state_dict()`` hands that count to the
# plan that the iterator's workers follow (``EpochPlan.state_dict(steps)``), which knows
# how torch's round-robin spreads batches over workers. ``load_state_dict()`` gives the
# plan state to the dataset; the next ``iter()`` of that epoch resumes from it, under any
# world size and worker count (the plan re-cuts what is left).
#
# After a resume with the same topology the batches must come in exactly the order of
# the uninterrupted run, so the round-robin must not restart at worker 0 but at the
# worker whose batch was next: ``plan.first_worker()``. torch builds the round-robin
# (``_worker_queue_idx_cycle``) in ``_MultiProcessingDataLoaderIter._reset`` and primes
# the prefetch from it right away, so ``_ResumableIter`` marks a reset and, on the first
# ``_try_put_index`` after it, replaces the cycle with one starting at that worker. That
# is the only behaviour it changes; everything else is torch's.
#
# Workers get the dataset (and with it a loaded state) pickled when they start. Two
# things reach workers that outlive an iterator (``persistent_workers=True``):
# - the epoch: the dataset then reads it from a shared-memory cell (binding.py's
#   ``Epoch``, shared by ``LoaderBinding.share_epoch``), which ``set_epoch`` writes in the
#   main process;
# - a loaded state: ``load_state_dict`` shuts the persistent workers down, and the next
#   ``iter()`` starts new ones carrying the state (a resume is rare; an epoch is not).
"""

from __future__ import annotations

import itertools
from typing import Any

from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from shardstream.dataset.binding import LoaderBinding
from shardstream.dataset.streaming import StreamingDataset
from shardstream.errors import UsageError

__all__ = ["DataLoader"]


class DataLoader(_TorchDataLoader):
    """A ``torch.utils.data.DataLoader`` over a :class:`StreamingDataset` with
    ``state_dict()``/``load_state_dict()`` for exact mid-epoch resume, also under another
    world size or number of workers. Takes torch's arguments; batches must come in order
    (``in_order=True``), and a partial last batch of each worker is kept (the dataset's
    ``drop_last`` drops samples so that ranks stay equal)."""

    def __init__(self, dataset: StreamingDataset, batch_size: int | None = 1, **kwargs: Any) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise UsageError(
                f"shardstream.DataLoader streams a StreamingDataset, not {type(dataset).__name__}"
            )
        if kwargs.get("in_order", True) is not True:
            raise UsageError("in_order=False reorders batches, so no state could say where an epoch stands")
        if kwargs.get("drop_last"):
            raise UsageError(
                "DataLoader(drop_last=True) would drop a partial batch in every worker; "
                "use StreamingDataset(drop_last=True) to drop the epoch's tail instead",
                url=dataset.url,
            )
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self._plan: Any = None  # the plan the current iterator's workers follow
        self._active: Any = None  # the current iterator
        self._binding = LoaderBinding(dataset, batch_size=batch_size, num_workers=self.num_workers)
        if self.persistent_workers and self.num_workers > 0:
            self._binding.share_epoch(self.multiprocessing_context)

    @property
    def streaming_dataset(self) -> StreamingDataset:
        return self.dataset  # type: ignore[return-value]

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        self.check_worker_number_rationality()
        return _ResumableIter(self)

    def __iter__(self) -> Any:
        # state_dict() maps the batch count through the plan the workers follow.
        self._binding.bind(batch_size=self.batch_size, num_workers=self.num_workers)
        self._plan = self._binding.begin()
        iterator = super().__iter__()
        self._binding.started()
        self._active = iterator
        return iterator

    def __len__(self) -> int:
        """Batches this rank gets in the epoch the next iteration plays."""
        return self._binding.plan(self.num_workers).batches_per_rank()

    def first_worker(self) -> int:
        """The worker whose batch the current iteration yields first."""
        return 0 if self._plan is None else int(self._plan.first_worker())

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands after the batches yielded so far (JSON-able)."""
        iterator = self._active
        steps = 0 if iterator is None else int(iterator._num_yielded)
        return self._binding.state(self._plan if iterator is not None else None, steps)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (also of a run with another topology): the next
        ``iter()`` of the state's epoch continues where that run stopped."""
        self._binding.bind(batch_size=self.batch_size, num_workers=self.num_workers)
        self._binding.load(state)
        self._plan, self._active = None, None
        iterator: Any = self._iterator
        if iterator is not None:  # persistent workers hold the old state: restart them
            iterator._shutdown_workers()
            self._iterator = None


class _ResumableIter(_MultiProcessingDataLoaderIter):
    """torch's multi-process iterator, its round-robin starting at ``plan.first_worker()``.
    See NOTE [ Exact resume through the DataLoader ]."""

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._first_worker = loader.first_worker() % self._num_workers
        self._cycle_pending = True
        super()._reset(loader, first_iter)

    def _try_put_index(self) -> None:
        if self._cycle_pending:
            self._cycle_pending = False
            first, count = self._first_worker, self._num_workers
            self._worker_queue_idx_cycle = itertools.cycle([*range(first, count), *range(first)])
        super()._try_put_index()
