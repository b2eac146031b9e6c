"""The options a dataset is made with, each group defined once as a small frozen value.

    read, decode, plan, tokens = split_options(
        "StreamingDataset", given, READ_OPTIONS, DECODE_OPTIONS, PLAN_OPTIONS, TOKEN_OPTIONS
    )

``StreamingDataset``, ``Stream`` and ``MapDataset`` take their keywords through these
groups instead of relaying them one by one: ``ReadOptions`` (how shards are fetched and
checked), ``DecodeOptions`` (how samples become values), the plan's ``PlanConfig`` (the
epoch's order; ``ShardSampler`` takes the same) and ``TokenOptions`` (a token dataset read
as packed sequences). Each is checked when it is made into what the dataset uses, and
names the dataset in its errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardstream.counts import check_int
from shardstream.dataset.decode import Decoder, SampleDecoder
from shardstream.dataset.fetch import READ_THREADS
from shardstream.errors import PlanError, UsageError
from shardstream.plan import PlanConfig
from shardstream.storage import Storage
from shardstream.storage.pacing import DEFAULT_START_RATE, StartPacing
from shardstream.tokens import Packing
from shardstream.tokens.build import SEQ_FIELDS
from shardstream.topology import detect

__all__ = [
    "DECODE_OPTIONS",
    "LOCAL_READS",
    "ON_ERROR",
    "PLAN_OPTIONS",
    "READ_OPTIONS",
    "TOKEN_OPTIONS",
    "DecodeOptions",
    "ReadOptions",
    "TokenOptions",
    "names_of",
    "plan_config",
    "split_options",
]

ON_ERROR = ("raise", "skip")
# How shards in a local folder are read: NOTE [ Getting the bytes ] in dataset/fetch.py.
LOCAL_READS = ("auto", "copy", "map")


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a dataset's shards are fetched and checked: its storage (``storage_options``,
    ``cache_dir``, ``cache_limit``, ``local_reads``: NOTE [ Getting the bytes ]), the
    per-read CRC check (``verify_checksums``, NOTE [ Checksummed reads ]), what a sample
    the format cannot read does (``on_error``), and on object storage the bytes fetched
    ahead and the requests in flight per worker (NOTE [ Read budget ]) and the request
    rate of the whole job while its readers start (``start_rate``, requests per second,
    ``None``: not paced; NOTE [ Paced start ] in storage/pacing.py)."""

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    cache_limit: int | None = None
    local_reads: str = "auto"
    verify_checksums: bool = True
    on_error: str = "raise"
    read_budget: int | None = None  # None: default_read_budget's (NOTE [ Read budget ])
    read_concurrency: int = READ_THREADS
    prefetch_windows: int = 1
    start_rate: float | None = DEFAULT_START_RATE

    def checked(self, url: str) -> ReadOptions:
        """These options (``storage_options`` as a plain dict), or ``UsageError`` naming ``url``."""
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise UsageError("storage_options must be a mapping", url=url)
        if self.on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}", url=url)
        if self.cache_limit is not None:
            check_int(self.cache_limit, "cache_limit", minimum=0, url=url)
        check_int(self.prefetch_windows, "prefetch_windows", url=url)
        if self.read_budget is not None:
            check_int(self.read_budget, "read_budget", minimum=1, url=url)
        check_int(self.read_concurrency, "read_concurrency", minimum=1, maximum=256, url=url)
        if not isinstance(self.verify_checksums, bool):
            raise UsageError(
                f"verify_checksums must be True or False, got {self.verify_checksums!r}", url=url
            )
        if self.local_reads not in LOCAL_READS:
            raise UsageError(f"local_reads must be one of {LOCAL_READS}, got {self.local_reads!r}", url=url)
        if self.start_rate is not None:
            try:
                StartPacing(self.start_rate)
            except UsageError as error:
                raise UsageError(error.message, url=url) from None
        return dataclasses.replace(self, storage_options=dict(self.storage_options or {}))

    def override(self, url: str, **given: Any) -> ReadOptions:
        """These options with those of ``given`` that are not ``None`` (a stream's own)."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None}).checked(url)

    def open_storage(self, url: str) -> Storage:
        """A new Storage of the dataset at ``url``, with these options and cache (one per
        process), its first reads paced for this process's share of ``start_rate``."""
        return Storage(
            url,
            self.storage_options,
            cache_dir=self.cache_dir,
            cache_limit=self.cache_limit,
            pacing=self.start_pacing(),
        )

    def start_pacing(self) -> StartPacing | None:
        """How this process's first requests are paced: ``start_rate`` shared by every
        reader of the job, world size x DataLoader workers as this process sees them."""
        if self.start_rate is None:
            return None
        try:
            here = detect()
        except UsageError:  # a topology the dataset refuses itself, with its own words
            return StartPacing(self.start_rate)
        return StartPacing(self.start_rate, processes=here.world_size * max(1, here.num_workers))


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """How samples become values: decoded by extension (``decoders`` override the
    registry, ``allow_pickle`` lets pickled fields load) unless ``decode=False``, then
    ``transform`` called on each."""

    decode: bool = True
    decoders: Mapping[str, Decoder] | None = None
    allow_pickle: bool = False
    transform: Callable[[dict[str, Any]], Any] | None = None

    def decoder(self, url: str) -> SampleDecoder | None:
        """The decoder these options make (the registry snapshotted now), ``None`` with
        ``decode=False``; ``UsageError`` for a transform that cannot be called."""
        if self.transform is not None and not callable(self.transform):
            raise UsageError("transform must be callable", url=url)
        if not self.decode:
            return None
        return SampleDecoder.build(self.decoders, allow_pickle=self.allow_pickle)


def plan_config(url: str, given: Mapping[str, Any]) -> PlanConfig:
    """The plan's config from the ``PLAN_OPTIONS`` a user gave a dataset, or ``UsageError``
    naming ``url`` for a bad value (the plan refuses it as a ``PlanError``, same words)."""
    try:
        config = PlanConfig(**given)
    except PlanError as error:  # a user's value, named with the dataset
        raise UsageError(str(error), url=url) from error
    return dataclasses.replace(config, shuffle=bool(config.shuffle), drop_last=bool(config.drop_last))


@dataclass(frozen=True, slots=True)
class TokenOptions:
    """A token dataset read as packed sequences of ``seq_len`` tokens (NOTE [ Reading
    sequences ]); without ``seq_len``, as its documents. ``seq_fields`` names the arrays a
    sequence carries, of ``SEQ_FIELDS`` (default: all of them); those not named are not
    made at all, and ``labels`` keep their -100 where nothing is to be predicted."""

    seq_len: int | None = None
    packing: str | None = None
    long_docs: str | None = None
    seq_fields: Sequence[str] | None = None

    def fields_of(self, url: str) -> tuple[str, ...]:
        """The arrays a sequence carries, in ``SEQ_FIELDS`` order, or ``UsageError`` naming
        ``url`` for a name that is not one of them."""
        if self.seq_fields is None:
            return SEQ_FIELDS
        if self.seq_len is None:
            raise UsageError("seq_fields is an option of packed sequences: give a seq_len too", url=url)
        given: Any = self.seq_fields
        names = [given] if isinstance(given, str) else list(given) if isinstance(given, Sequence) else [given]
        wrong = [name for name in names if not isinstance(name, str) or name not in SEQ_FIELDS]
        if wrong or not names:
            shown = f"got {wrong[0]!r}" if wrong else "got none"
            raise UsageError(f"seq_fields must name some of {', '.join(SEQ_FIELDS)}; {shown}", url=url)
        return tuple(name for name in SEQ_FIELDS if name in names)

    def packing_of(self, url: str) -> Packing | None:
        """How the documents become sequences, or ``None`` to read documents."""
        if self.seq_len is None:
            if self.packing is not None or self.long_docs is not None:
                raise UsageError(
                    "packing and long_docs are options of packed sequences: give a seq_len too", url=url
                )
            return None
        try:
            return Packing(self.seq_len, self.packing or "concat", self.long_docs or "split")
        except UsageError as error:
            raise UsageError(error.message, url=url) from None


def names_of(options: type[Any]) -> frozenset[str]:
    """The keywords of an options class: its fields."""
    return frozenset(f.name for f in dataclasses.fields(options))


READ_OPTIONS = names_of(ReadOptions)
DECODE_OPTIONS = names_of(DecodeOptions)
TOKEN_OPTIONS = names_of(TokenOptions)
# The plan's options are its config's fields (shared with ShardSampler), but the dataset's
# bytes, which a dataset tells its plans itself (NOTE [ Global window ]).
PLAN_OPTIONS = names_of(PlanConfig) - {"dataset_bytes"}


def split_options(
    owner: str, given: Mapping[str, Any], *groups: frozenset[str], refused: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], ...]:
    """The keywords of ``given`` in each of ``groups`` (sets of names); a keyword of none
    of them, or in ``refused``, is the ``TypeError`` Python gives for an unexpected
    keyword of ``owner``."""
    for name in given:
        if name in refused or not any(name in group for group in groups):
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
    return tuple({k: v for k, v in given.items() if k in group} for group in groups)
