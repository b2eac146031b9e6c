"""How a dataset folder is laid out: the names shardstream writes there, and its manifest.

``pack`` writes these names and ``catalog`` (``index``, ``verify``) reads them back, so
the rules live here, below both, and import neither. In a dataset folder:

- shards ``shard-NNNNNN.<suffix>``, those of ``--part I/N`` named
  ``part-IIIII-shard-NNNNNN.<suffix>``, at the top (``index`` takes shards below it too);
- in ``.shardstream/`` (``META_FOLDER``, NOTE [ The dataset folder as others read it ]):
  each shard's sample-index sidecar ``<shard>.idx``; ``part-IIIII-of-NNNNN.json``, a
  finished part's record (a manifest of its shards), which ``index`` joins into one
  dataset; and ``manifest.json`` (``manifest.MANIFEST_NAME``), built by ``build_manifest``,
  written last;
- ``.shardstream-pack[-part-IIIII].json``, the record of a pack in progress (NOTE
  [ Packs in progress ] in ``pack.dest``);
- ``.shardstream-lock[-part-IIIII].<run id>.json``, a pack's claim on the folder (NOTE
  [ One pack per destination ] in ``lock``).

These names are read back by later versions (a rerun resumes a killed pack, ``index``
joins parts packed by another machine), so changing one is a format change. Datasets
written before ``.shardstream/`` existed keep their sidecars beside their shards and
their manifest and part records at the top (the legacy layout): they are read, resumed
and joined as they are, and a pack or ``index`` that rewrites one moves it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardstream._version import __version__
from shardstream.errors import ManifestError, PackError, shown
from shardstream.formats import available_formats
from shardstream.manifest import (
    LEGACY_MANIFEST_NAME as LEGACY_MANIFEST_NAME,
)
from shardstream.manifest import (
    MANIFEST_NAME as MANIFEST_NAME,
)
from shardstream.manifest import (
    Manifest,
    ShardInfo,
    TokensInfo,
)

if TYPE_CHECKING:
    from shardstream.formats import SampleIndex

SHARD_PREFIX = "shard-"
# NOTE [ The dataset folder as others read it ]
# A dataset folder should load in the tools its users have, as it is: Hugging Face
# ``datasets.load_dataset(folder)``, DuckDB's ``read_parquet('folder/*.parquet')``,
# ``webdataset.WebDataset`` on a brace URL, pyarrow's ``dataset(folder)``. Hugging Face
# takes every file of the folder whose name holds a data extension as data: a sidecar
# ``shard-000000.parquet.idx`` was read as Parquet (and failed), and a ``manifest.json``
# beside one tar shard made it pick its JSON builder and load the manifest as the data.
# It skips files and folders whose names start with a dot (and folders starting with
# ``__``); pyarrow's dataset discovery skips names starting with ``.`` or ``_``. So all
# that shardstream keeps beside the shards goes in one folder, ``.shardstream/``, as
# the records of packs in progress (``.shardstream-pack*.json``) always did: the top of
# the folder holds the shards alone. The other way, writing the ``configs:`` YAML of a
# README.md that Hugging Face reads, would put a file of ours where users keep their own
# dataset card, and would help Hugging Face only. (A copy of the folder must take its
# hidden entries too: ``cp -r folder dest``, ``aws s3 sync``, not ``cp folder/* dest``.)
META_FOLDER = ".shardstream"


def shard_name_re() -> re.Pattern[str]:
    """Every shard or sidecar name a shardstream pack writes: a shard of any format
    registered now (``shard-000000`` plus the format's suffix), or its sidecar (in
    ``.shardstream/``, or beside it in the legacy layout)."""
    return _shard_name_re(tuple(sorted({fmt.suffix for fmt in available_formats().values()})))


@functools.lru_cache(maxsize=16)
def _shard_name_re(suffixes: tuple[str, ...]) -> re.Pattern[str]:
    formats = "|".join(map(re.escape, suffixes))
    shard = rf"(?:part-\d{{5}}-)?shard-\d{{6}}(?:{formats})"
    return re.compile(rf"^(?:{shard}|(?:{re.escape(META_FOLDER)}/)?{shard}\.(?:idx|fit\d+))$")


# The names of the built-in formats' shards, for importers; a pack asks ``shard_name_re()``,
# which knows the formats registered after this module was imported too.
SHARD_NAME_RE = shard_name_re()
# A shard (or sidecar) of a part; group 1 is the part's index.
PART_SHARD_RE = re.compile(r"^(?:\.shardstream/)?part-(\d{5})-shard-\d{6}\.")
# A finished part's record (either layout); groups: the part's index, the number of parts.
PART_RECORD_RE = re.compile(r"^(?:\.shardstream/)?part-(\d{5})-of-(\d{5})\.json$")
# The record of a pack in progress (NOTE [ Packs in progress ]), of a part if it names one.
PACK_RECORD_RE = re.compile(r"^\.shardstream-pack(?:-part-(\d{5}))?\.json$")
# A pack's claim; groups: its scope ("-part-IIIII", or None for the whole dataset), its run id.
CLAIM_RE = re.compile(r"^\.shardstream-lock(-part-\d{5})?\.([0-9a-f]+)\.json$")


def part_prefix(part: int) -> str:
    """The start of the shard names of part number ``part``."""
    return f"part-{part:05d}-shard-"


def shard_name(prefix: str, number: int, suffix: str) -> str:
    """Shard ``number`` of a pack whose shard names start with ``prefix`` (``SHARD_PREFIX`` or a part's)."""
    return f"{prefix}{number:06d}{suffix}"


def sidecar_name(shard: str) -> str:
    """The sample-index sidecar of ``shard`` (a path in the folder): ``.shardstream/<shard>.idx``."""
    return f"{META_FOLDER}/{shard}.idx"


def fit_sidecar_name(shard: str, seq_len: int) -> str:
    """The best-fit bins of ``shard`` for sequences of ``seq_len`` tokens: ``.shardstream/<shard>.fit<S>``."""
    return f"{META_FOLDER}/{shard}.fit{seq_len}"


def part_record_name(part: int, count: int) -> str:
    """The record of part number ``part`` of ``count``, written when the part is whole."""
    return f"{META_FOLDER}/{legacy_part_record_name(part, count)}"


def legacy_part_record_name(part: int, count: int) -> str:
    """Where a part's record is in the legacy layout: at the top of the folder."""
    return f"part-{part:05d}-of-{count:05d}.json"


def own_name(path: str) -> str:
    """A file's name as ``SHARD_PREFIX`` or a part's prefix starts it: ``path`` outside
    ``.shardstream/``, ``shard-000000.tar.idx`` for ``.shardstream/shard-000000.tar.idx``."""
    return path.removeprefix(META_FOLDER + "/")


def part_scope(part: int | None) -> str:
    """What the names of a pack's record and claims carry: ``""`` for a whole pack, else its part."""
    return "" if part is None else f"-part-{part:05d}"


def pack_record_name(scope: str) -> str:
    """The record of a pack in progress of ``scope`` (``part_scope``)."""
    return f".shardstream-pack{scope}.json"


def claim_name(scope: str, run: str) -> str:
    """The claim object of run ``run`` of a pack of ``scope`` (``part_scope``)."""
    return f".shardstream-lock{scope}.{run}.json"


def writer_name() -> str:
    """What a manifest and a pack's record name as their writer."""
    return f"shardstream {__version__}"


@dataclass(frozen=True, slots=True)
class ShardResult:
    """What writing one shard gave: its manifest entry, fields and (Parquet) schema."""

    info: ShardInfo
    fields: tuple[str, ...] = ()
    schema: dict[str, str] = field(default_factory=dict)
    reused: bool = False
    token_dtype: str | None = None  # a token shard's id type (``SampleIndex.token_dtype``)
    # column -> key of the sample its type came from, where the pack knows it
    origins: dict[str, str] = field(default_factory=dict)


def fields_and_schema(index: SampleIndex) -> tuple[tuple[str, ...], dict[str, str]]:
    """The fields (and, for typed formats, the schema) a format's index knows."""
    return tuple(index.fields), dict(index.schema)


# NOTE [ One schema per dataset ]
# A Parquet shard's schema is inferred from its own first rows, so JSON Lines whose
# ``cls`` is an integer in one shard's rows and a string in the next's packed into
# shards of two schemas, under a manifest naming the first: DuckDB and Hugging Face,
# which read the folder as one table, refused it. So ``build_manifest`` (a pack's, a
# ``ShardWriter``'s and ``index``'s) refuses shards that disagree on a column's type,
# naming both shards and, where the pack knows it, the sample each type came from. It
# does not widen (int to float, or anything to string): a value of another type is more
# often a bug in the data than a wish, and a type that changed silently would surprise
# the reader of the first shard. A column empty (null) in a shard takes its type from
# the others, as readers take it.
def build_manifest(format: str, results: list[ShardResult], tokens: TokensInfo | None = None) -> Manifest:
    """The manifest of shards ``results`` (in order): fields are the union over shards.

    ``tokens`` describes a token dataset's ids; without it, token shards (those with a
    ``token_dtype``) get a record of their type alone, which must be the same for all."""
    dtypes = {r.token_dtype for r in results if r.token_dtype is not None}
    if len(dtypes) > 1:
        raise ManifestError(
            f"token shards of several id types ({', '.join(sorted(dtypes))}); a dataset has one"
        )
    if tokens is None and dtypes:
        tokens = TokensInfo(dtype=dtypes.pop())
    elif tokens is not None and dtypes and dtypes != {tokens.dtype}:
        raise ManifestError(f"token shards of {dtypes.pop()} ids in a dataset of {tokens.dtype} ids")
    fields: set[str] = set()
    schema: dict[str, str] = {}
    typed_by: dict[str, ShardResult] = {}
    for result in results:
        fields.update(result.fields)
        for column, kind in result.schema.items():
            first = schema.setdefault(column, kind)
            if kind == "null":
                continue
            if first == "null":  # a shard where the column is empty says nothing of its type
                schema[column] = kind
            elif kind != first:
                raise _schemas_differ(column, typed_by[column], result)
            typed_by.setdefault(column, result)
    key_column = "__key__" if "__key__" in schema else None
    return Manifest(
        format=format,
        shards=tuple(r.info for r in results),
        fields=tuple(sorted(fields - {"__key__"})),
        schema=schema,
        key_column=key_column,
        writer=writer_name(),
        tokens=tokens,
    )


def _schemas_differ(column: str, first: ShardResult, other: ShardResult) -> PackError:
    """NOTE [ One schema per dataset ]: shards that disagree on a column's type."""

    def where(result: ShardResult) -> str:
        origin = result.origins.get(column)
        sample = f" (from sample {shown(origin)})" if origin is not None else ""
        return f"{result.schema[column]} in {result.info.path}{sample}"

    return PackError(
        f"column {column!r} is {where(first)} but {where(other)}: one dataset has one schema "
        "(DuckDB, Hugging Face and pyarrow read its shards as one table); give the column "
        "values of one type in every sample (a string column: str everywhere)",
        shard=other.info.path,
    )
