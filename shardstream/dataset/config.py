"""The options of a :class:`~shardstream.dataset.StreamingDataset`, frozen in one value.

The dataset's constructor only builds a :class:`DatasetConfig`; everything downstream (the
plan, the reader, the decoders, the workers) reads this one picklable value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardstream.dataset.decode import Decoder, SampleDecoder
from shardstream.errors import UsageError

__all__ = ["ON_ERROR", "DatasetConfig"]

ON_ERROR = ("raise", "skip")


@dataclass(frozen=True, slots=True)
class DatasetConfig:
    """What to stream and how.

    ``num_replicas``/``rank`` override the detected topology (``None``: detect);
    ``batch_size`` is the batch size the plan assumes when no shardstream DataLoader tells
    it one; ``decoder`` is ``None`` with ``decode=False``.
    """

    url: str
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shuffle_window: int | None = None
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

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise UsageError(f"dataset url must be a non-empty string, got {self.url!r}")
        if self.on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}", url=self.url)
        _check_int("seed", self.seed, minimum=None, url=self.url)
        for name in ("shuffle_window", "batch_size", "num_replicas"):
            _check_int(name, getattr(self, name), minimum=1, url=self.url, optional=True)
        _check_int("rank", self.rank, minimum=0, url=self.url, optional=True)
        _check_int("cache_limit", self.cache_limit, minimum=0, url=self.url, optional=True)
        _check_int("prefetch_windows", self.prefetch_windows, minimum=0, url=self.url)
        if not isinstance(self.verify_checksums, bool):
            raise UsageError(
                f"verify_checksums must be True or False, got {self.verify_checksums!r}", url=self.url
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
        **options: Any,
    ) -> DatasetConfig:
        """The config for ``StreamingDataset(url, ...)``: snapshots the decoder registry."""
        decoder = SampleDecoder.build(decoders, allow_pickle=allow_pickle) if decode else None
        return cls(
            url=str(url).rstrip("/") or str(url),
            decoder=decoder,
            storage_options=dict(storage_options or {}),
            **options,
        )


def _check_int(name: str, value: Any, *, minimum: int | None, url: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer, got {value!r}", url=url)
    if minimum is not None and value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}", url=url)
