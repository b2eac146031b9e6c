"""The dataset manifest: ``.shardstream/manifest.json`` in a dataset folder (at its top,
``manifest.json``, in datasets of the legacy layout: see ``shardstream.folder``).

It lists every shard (path relative to the dataset folder, sample count, byte size,
sha256, and the path of its sample-index sidecar), the fields of a sample, the totals
and the writer. It holds no timestamps and no absolute paths, so the same input always gives
the same manifest and a dataset folder can be copied or moved as a whole. It is written
last and atomically: a dataset without a manifest is not a dataset.
"""

from __future__ import annotations

import hashlib
import json
import re
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardstream.counts import MAX_COUNT, check_int
from shardstream.errors import ManifestError
from shardstream.formats import available_formats

__all__ = [
    "sequences_key",
    "FORMATS",
    "LEGACY_MANIFEST_NAME",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "Manifest",
    "ShardInfo",
    "TokensInfo",
    "counts_checksum",
    "dataset_fingerprint",
]

MANIFEST_NAME = ".shardstream/manifest.json"
LEGACY_MANIFEST_NAME = "manifest.json"  # where datasets of the legacy layout have it
MANIFEST_VERSION = 1
# The built-in formats; a manifest may name any format registered when it loads.
FORMATS = ("tar", "parquet", "tokens")
_TOKEN_DTYPES = ("uint16", "uint32", "uint8", "int8", "int16", "int32", "int64")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PATHS = reprlib.Repr()
_PATHS.maxstring = 200  # a path in an error whole (sidecars: .shardstream/<shard>.idx), a hostile one cut


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard: where it is (relative to the dataset folder) and what it holds."""

    path: str
    samples: int
    bytes: int
    sha256: str
    index: str  # sidecar with the per-sample index, relative to the dataset folder
    index_bytes: int = 0
    tokens: int | None = None  # token ids in the shard (token datasets); its samples are documents

    def to_dict(self) -> dict[str, Any]:
        entry = {
            "path": self.path,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "index": self.index,
            "index_bytes": self.index_bytes,
        }
        if self.tokens is not None:
            entry["tokens"] = self.tokens
        return entry


@dataclass(frozen=True, slots=True)
class TokensInfo:
    """What the token ids of a token dataset are: their numpy type, and the tokenizer that
    made them where known (a foreign corpus says only its type). ``tokenizer`` is its
    fingerprint: ``sha256:<hex>`` of a ``tokenizer.json``'s bytes, or ``<name>@sha256:<hex>``."""

    dtype: str
    vocab_size: int | None = None
    eos_id: int | None = None
    bos_id: int | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in _TOKEN_DTYPES:
            raise ManifestError(
                f"token type {reprlib.repr(self.dtype)} is not one of {', '.join(_TOKEN_DTYPES)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "tokenizer": self.tokenizer,
        }

    @classmethod
    def from_dict(cls, value: object, url: str | None) -> TokensInfo:
        if not isinstance(value, dict):
            raise ManifestError("manifest field 'tokens' must be a JSON object", url=url)
        numbers = {}
        for key in ("vocab_size", "eos_id", "bos_id"):
            number = value.get(key)
            numbers[key] = None if number is None else _count(number, f"tokens.{key}", url)
        try:
            return cls(
                dtype=_string(value, "dtype", url),
                tokenizer=_string(value, "tokenizer", url, optional=True),
                **numbers,
            )
        except ManifestError as error:
            raise ManifestError(error.message, url=url) from None


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a dataset holds. ``fields`` are tar extensions or Parquet column names."""

    format: str
    shards: tuple[ShardInfo, ...]
    fields: tuple[str, ...] = ()
    schema: dict[str, str] = field(default_factory=dict)  # Parquet: column -> arrow type
    key_column: str | None = None  # Parquet: the column that names a sample, if any
    writer: str = ""
    version: int = MANIFEST_VERSION
    tokens: TokensInfo | None = None  # token datasets: what their ids are
    # token datasets: each shard's packed sequences for a packing (``sequences_key``),
    # recorded by ``shardstream index --seq-len`` so that a plan needs no sidecar to count them
    sequences: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = available_formats()
        if not isinstance(self.format, str) or self.format not in known:
            raise ManifestError(
                f"unknown shard format {reprlib.repr(self.format)}; known: {', '.join(known)}"
            )
        seen: set[str] = set()
        for shard in self.shards:  # NOTE [ What a manifest must say ]
            for what, path in (("shard", shard.path), ("sample index", shard.index)):
                if path in seen:
                    raise ManifestError(
                        f"the manifest lists {what} path {_PATHS.repr(path)} twice (as a shard or a sample index)",
                        shard=shard.path,
                    )
                seen.add(path)

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def num_tokens(self) -> int | None:
        """Token ids in the dataset, where every shard counts them; else None."""
        counts = [s.tokens for s in self.shards]
        return None if not counts or None in counts else sum(c for c in counts if c is not None)

    @property
    def shard_sizes(self) -> list[int]:
        """Sample count of each shard, in manifest order: the epoch plan's input."""
        return [s.samples for s in self.shards]

    def to_dict(self) -> dict[str, Any]:
        out = {
            "version": self.version,
            "format": self.format,
            "writer": self.writer,
            "fields": list(self.fields),
            "schema": dict(sorted(self.schema.items())),
            "key_column": self.key_column,
            "num_shards": len(self.shards),
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "shards": [s.to_dict() for s in self.shards],
        }
        if self.tokens is not None:  # only where there are tokens: other manifests keep their bytes
            out["tokens"] = self.tokens.to_dict()
            out["num_tokens"] = self.num_tokens
        if self.sequences:
            out["sequences"] = {key: list(counts) for key, counts in sorted(self.sequences.items())}
        return out

    def to_json(self) -> str:
        """Deterministic JSON: the same manifest always gives the same bytes."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=False, ensure_ascii=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, url: str | None = None) -> Manifest:
        """Parse and validate a manifest; ``url`` only names it in errors.

        See NOTE [ What a manifest must say ]: every count an integer, every path inside
        the dataset and listed once, the totals those of the shards.
        """
        try:
            data = json.loads(text)
        except RecursionError:  # the C parser recurses once per nested list or object
            raise ManifestError("manifest is not valid JSON: it nests too deeply", url=url) from None
        except ValueError as error:
            raise ManifestError(f"manifest is not valid JSON: {error}", url=url) from None
        if not isinstance(data, dict):
            raise ManifestError("manifest is not a JSON object", url=url)
        version = data.get("version")
        if version != MANIFEST_VERSION or type(version) is not int:
            raise ManifestError(
                f"manifest version {reprlib.repr(version)} is not supported (this shardstream reads "
                f"version {MANIFEST_VERSION}); upgrade shardstream or re-index the dataset",
                url=url,
            )
        shards = data.get("shards")
        if not isinstance(shards, list):
            raise ManifestError("manifest field 'shards' must be a list", url=url)
        infos = tuple(_shard_info(entry, number, url) for number, entry in enumerate(shards))
        try:
            manifest = cls(
                format=_string(data, "format", url),
                shards=infos,
                fields=tuple(_strings(data.get("fields", []), "fields", url)),
                schema=_schema(data.get("schema"), url),
                key_column=_string(data, "key_column", url, optional=True),
                writer=_string(data, "writer", url, default=""),
                version=version,
                tokens=None if data.get("tokens") is None else TokensInfo.from_dict(data["tokens"], url),
                sequences=_sequences(data.get("sequences"), len(infos), url),
            )
        except ManifestError as error:
            raise ManifestError(error.message, url=url, shard=error.shard) from None
        _check_totals(data, manifest, url)
        return manifest


# NOTE [ What a manifest must say ]
# The manifest is the one thing a reader trusts about a dataset, so it is read strictly:
# - counts and sizes are JSON integers (not 25.9, not 25.0, not true): a float count
#   would be truncated and a sample lost or read past its shard;
# - each shard path and each sidecar path appears once among all of them: a shard listed
#   twice would stream its samples twice every epoch, and two shards sharing a sidecar
#   would read one shard's samples with the other's byte ranges;
# - paths are relative and stay inside the dataset folder; a sha256 is 64 hex digits;
# - num_shards, num_samples and num_bytes, where given, are those of the shard list: a
#   disagreement means the manifest was edited or cut short.
# Manifests written by every shardstream so far meet all of this.


def _where(number: int, entry: Mapping[str, Any]) -> str:
    path = entry.get("path")
    return path if isinstance(path, str) else f"#{number}"


def _string(
    record: Mapping[str, Any],
    key: str,
    url: str | None,
    *,
    optional: bool = False,
    default: str | None = None,
) -> Any:
    value = record.get(key, default)
    if (value is None and optional) or isinstance(value, str):
        return value
    raise ManifestError(f"manifest field {key!r} must be a string, not {reprlib.repr(value)}", url=url)


def _strings(value: object, key: str, url: str | None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(f"manifest field {key!r} must be a list of strings", url=url)
    return value


def sequences_key(mode: str, seq_len: int, long_docs: str = "split") -> str:
    """The name under which a manifest records each shard's packed sequences of a packing."""
    return f"{mode}/{seq_len}" + ("/truncate" if long_docs == "truncate" else "")


def _sequences(value: object, shards: int, url: str | None) -> dict[str, tuple[int, ...]]:
    """``sequences``: for each packing, one count per shard."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ManifestError("manifest field 'sequences' must be a JSON object", url=url)
    out = {}
    for key, counts in value.items():
        if not isinstance(counts, list) or len(counts) != shards:
            raise ManifestError(f"manifest field 'sequences.{key}' must list one count per shard", url=url)
        out[key] = tuple(c if _fits(c) else _count(c, f"sequences.{key}", url) for c in counts)
    return out


def _schema(value: object, url: str | None) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ManifestError("manifest field 'schema' must map column names to type names", url=url)
    return dict(value)


def _count(value: object, key: str, url: str | None, shard: str | None = None) -> int:
    """A JSON integer in ``[0, 2**63)`` (what numpy and the plan can hold)."""
    if type(value) is int and 0 <= value <= MAX_COUNT:  # the common case, at once
        return value
    return check_int(
        value, f"manifest field {key!r}", maximum=MAX_COUNT, error=ManifestError, url=url, shard=shard
    )


def _fits(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def _shard_info(entry: object, number: int, url: str | None) -> ShardInfo:
    """One shard's entry, checked as NOTE [ What a manifest must say ] says: a well-formed
    entry at once (a manifest may list 100,000 of them), any other by ``_checked_shard_info``,
    which names what is wrong."""
    if type(entry) is dict:
        path, sha256, index = entry.get("path"), entry.get("sha256"), entry.get("index")
        samples, size, index_bytes = entry.get("samples"), entry.get("bytes"), entry.get("index_bytes", 0)
        tokens = entry.get("tokens")
        if (
            type(path) is str
            and type(sha256) is str
            and type(index) is str
            and _fits(samples)
            and _fits(size)
            and _fits(index_bytes)
            and (tokens is None or _fits(tokens))
            and _SHA256_RE.fullmatch(sha256)
            and _inside(path)
            and _inside(index)
        ):
            return ShardInfo(path, samples, size, sha256, index, index_bytes, tokens)  # type: ignore[arg-type]
    return _checked_shard_info(entry, number, url)


def _checked_shard_info(entry: object, number: int, url: str | None) -> ShardInfo:
    if not isinstance(entry, dict):
        raise ManifestError(f"manifest shard #{number} is not a JSON object", url=url)
    shard = _where(number, entry)
    strings = {}
    for key in ("path", "sha256", "index"):
        value = entry.get(key)
        if not isinstance(value, str):
            raise ManifestError(
                f"manifest shard field {key!r} must be a string, not {reprlib.repr(value)}",
                url=url,
                shard=shard,
            )
        strings[key] = value
    if not _SHA256_RE.fullmatch(strings["sha256"]):
        raise ManifestError("manifest shard field 'sha256' must be 64 hex digits", url=url, shard=shard)
    for key in ("path", "index"):
        if not _inside(strings[key]):
            raise ManifestError(
                f"shard {key} must be relative and inside the dataset: {_PATHS.repr(strings[key])}",
                url=url,
                shard=shard,
            )
    return ShardInfo(
        path=strings["path"],
        samples=_count(entry.get("samples"), "samples", url, shard),
        bytes=_count(entry.get("bytes"), "bytes", url, shard),
        sha256=strings["sha256"],
        index=strings["index"],
        index_bytes=_count(entry.get("index_bytes", 0), "index_bytes", url, shard),
        tokens=None if entry.get("tokens") is None else _count(entry["tokens"], "tokens", url, shard),
    )


def _inside(path: str) -> bool:
    if path and path[0] != "/" and ".." not in path:  # the common case, without a split
        return True
    return bool(path) and not path.startswith("/") and ".." not in path.split("/")


def _check_totals(data: Mapping[str, Any], manifest: Manifest, url: str | None) -> None:
    actual: dict[str, int | None] = {
        "num_shards": len(manifest.shards),
        "num_samples": manifest.num_samples,
        "num_bytes": manifest.num_bytes,
    }
    if manifest.tokens is not None:
        actual["num_tokens"] = manifest.num_tokens
    for key, total in actual.items():
        if key not in data or (key == "num_tokens" and data[key] is None and total is None):
            continue
        given = _count(data[key], key, url)
        if given != total:
            raise ManifestError(f"manifest says {key}={given}, its shards add up to {total}", url=url)


def counts_checksum(shard_sizes: Sequence[int]) -> str:
    """A short fingerprint of a dataset's shard layout, stored in resume states."""
    digest = hashlib.sha256(",".join(str(int(n)) for n in shard_sizes).encode())
    return digest.hexdigest()[:16]


def dataset_fingerprint(manifest: Manifest) -> str:
    """What a dataset holds, in 32 hex digits: a hash of its format and of each shard's
    path and sha256, in order. Resume states carry it, so that a state of another dataset
    with the same shard sizes is refused; it leaves the dataset's URL out, so a dataset
    moved or copied elsewhere keeps it."""
    listing = [manifest.format, [[s.path, s.sha256] for s in manifest.shards]]
    return hashlib.sha256(json.dumps(listing, ensure_ascii=True).encode()).hexdigest()[:32]
