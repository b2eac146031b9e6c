"""The options of a :class:`~shardstream.dataset.StreamingDataset`, frozen in one value.

The dataset's constructor only builds a :class:`DatasetConfig`; everything downstream (the
plan, the reader, the decoders, the workers) reads this one picklable value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardstream.counts import check_int
from shardstream.dataset.budget import DEFAULT_READ_BUDGET
from shardstream.dataset.decode import Decoder, SampleDecoder
from shardstream.dataset.fetch import READ_THREADS
from shardstream.diagnose import read_manifest
from shardstream.errors import ManifestError, PlanError, UsageError
from shardstream.manifest import Manifest
from shardstream.plan import PlanConfig
from shardstream.plan.config import check_seed
from shardstream.storage import Storage
from shardstream.tokens import Packing

__all__ = ["LOCAL_READS", "ON_ERROR", "DatasetConfig", "read_streamable_manifest"]

ON_ERROR = ("raise", "skip")
# How shards in a local folder are read: NOTE [ Getting the bytes ] in dataset/fetch.py.
LOCAL_READS = ("auto", "copy", "map")


@dataclass(frozen=True, slots=True)
class DatasetConfig:
    """What to stream and how.

    ``plan`` holds the plan's knobs (``shuffle``, ``seed``, ``drop_last``,
    ``shuffle_window``, also readable here as attributes; ``order``,
    ``global_batch_size`` and ``read_lanes`` of NOTE [ Global order ]); ``num_replicas``/``rank``
    override the detected topology (``None``: detect); ``batch_size`` is the batch size
    the plan assumes when no shardstream DataLoader tells it one; ``decoder`` is ``None``
    with ``decode=False``.
    """

    url: str
    plan: PlanConfig = field(default_factory=PlanConfig)
    num_replicas: int | None = None
    rank: int | None = None
    batch_size: int | None = None
    decoder: SampleDecoder | None = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    cache_limit: int | None = None
    on_error: str = "raise"
    prefetch_windows: int = 1
    verify_checksums: bool = True  # check each read's block CRCs (NOTE [ Checksummed reads ])
    local_reads: str = "auto"  # one of LOCAL_READS: copy or map local shard files
    # On object storage: bytes fetched ahead per worker (NOTE [ Read budget ]) and requests
    # in flight per worker (NOTE [ Getting the bytes ]).
    read_budget: int = DEFAULT_READ_BUDGET
    read_concurrency: int = READ_THREADS
    # A token dataset read as packed sequences (NOTE [ Reading sequences ]); None: as documents.
    sequences: Packing | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise UsageError(f"dataset url must be a non-empty string, got {self.url!r}")
        if self.on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}", url=self.url)
        if not isinstance(self.plan, PlanConfig):
            raise UsageError(f"plan must be a PlanConfig, not {type(self.plan).__name__}", url=self.url)
        for name, minimum in (("batch_size", 1), ("num_replicas", 1), ("rank", 0), ("cache_limit", 0)):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name, minimum=minimum, url=self.url)
        check_int(self.prefetch_windows, "prefetch_windows", url=self.url)
        check_int(self.read_budget, "read_budget", minimum=1, url=self.url)
        check_int(self.read_concurrency, "read_concurrency", minimum=1, maximum=256, url=self.url)
        if not isinstance(self.verify_checksums, bool):
            raise UsageError(
                f"verify_checksums must be True or False, got {self.verify_checksums!r}", url=self.url
            )
        if self.local_reads not in LOCAL_READS:
            raise UsageError(
                f"local_reads must be one of {LOCAL_READS}, got {self.local_reads!r}", url=self.url
            )
        if self.transform is not None and not callable(self.transform):
            raise UsageError("transform must be callable", url=self.url)

    @classmethod
    def build(
        cls,
        url: str,
        *,
        decode: bool = True,
        decoders: Mapping[str, Decoder] | None = None,
        allow_pickle: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        shuffle_window: int | None = None,
        order: str = "local",
        global_batch_size: int | None = None,
        read_lanes: int | None = None,
        seq_len: int | None = None,
        packing: str | None = None,
        long_docs: str | None = None,
        **options: Any,
    ) -> DatasetConfig:
        """The config for ``StreamingDataset(url, ...)``: snapshots the decoder registry."""
        stripped = str(url).rstrip("/")
        url = str(url) if not stripped or stripped.endswith(":") else stripped  # "s3://" stays a URL
        sequences = _packing(url, seq_len, packing, long_docs)
        if sequences is not None:
            decode = False  # the sequences are arrays already
        # A user's bad value is a UsageError naming the dataset, as for every other
        # option; PlanConfig would refuse it too, but as a PlanError.
        check_seed(seed, UsageError, url=url)
        if shuffle_window is not None:
            check_int(shuffle_window, "shuffle_window", minimum=1, url=url)
        try:
            plan = PlanConfig(
                shuffle=bool(shuffle),
                seed=seed,
                drop_last=bool(drop_last),
                shuffle_window=shuffle_window,
                order=order,
                global_batch_size=global_batch_size,
                read_lanes=read_lanes,
            )
        except PlanError as error:  # the order's options: a user's value, named with the dataset
            raise UsageError(str(error), url=url) from error
        decoder = SampleDecoder.build(decoders, allow_pickle=allow_pickle) if decode else None
        return cls(
            url=url,
            plan=plan,
            decoder=decoder,
            storage_options=dict(storage_options or {}),
            sequences=sequences,
            **options,
        )

    def open_storage(self) -> Storage:
        """A new Storage of the dataset, with its options and cache (one per process)."""
        return Storage(self.url, self.storage_options, cache_dir=self.cache_dir, cache_limit=self.cache_limit)

    # The plan's knobs, read where they always were.

    @property
    def shuffle(self) -> bool:
        return self.plan.shuffle

    @property
    def seed(self) -> int:
        return self.plan.seed

    @property
    def drop_last(self) -> bool:
        return self.plan.drop_last

    @property
    def shuffle_window(self) -> int | None:
        return self.plan.shuffle_window


def _packing(url: str, seq_len: int | None, packing: str | None, long_docs: str | None) -> Packing | None:
    """How a token dataset's documents become sequences, or None to read documents."""
    if seq_len is None:
        if packing is not None or long_docs is not None:
            raise UsageError(
                "packing and long_docs are options of packed sequences: give a seq_len too", url=url
            )
        return None
    try:
        return Packing(seq_len, packing or "concat", long_docs or "split")
    except UsageError as error:
        raise UsageError(error.message, url=url) from None


def read_streamable_manifest(storage: Storage) -> Manifest:
    """``storage``'s manifest, refused when it lists no shards: a pack never writes one
    (it refuses an empty source), so it is hand-made or cut short, and streaming it would
    end every epoch at once with no error (``verify`` names the shard files beside it)."""
    manifest = read_manifest(storage)  # where there is none, it says why
    if not manifest.shards:
        raise ManifestError(
            f"the manifest of {storage.url} lists no shards: nothing to read "
            f"(`shardstream verify {storage.url}` names the shard files beside it)",
            url=storage.url,
        )
    return manifest
