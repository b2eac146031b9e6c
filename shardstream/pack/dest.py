"""The destination of a pack: what it held before, and the manifest written last.

Rules (``pack`` and ``ShardWriter`` alike):
- no manifest there: shards already at their final names are reused when identical
  (a killed pack restarted; see NOTE [ Restartable shards ] in ``shard``), replaced
  otherwise;
- a manifest there, no ``overwrite``: the pack may only rewrite the same dataset: a
  shard that would differ from the manifest's (or a shard it does not list) is refused
  before anything changes;
- a manifest there with ``overwrite``: the manifest is deleted first (from then on no
  half dataset is readable), and the old dataset's shards that the new one does not
  reuse are deleted at the end.
Only names that shardstream writes are ever deleted.
"""

from __future__ import annotations

import contextlib
import os
import re

from shardstream import __version__
from shardstream.errors import ManifestError, UsageError
from shardstream.manifest import MANIFEST_NAME, Manifest, ShardInfo
from shardstream.pack.durable import ShardSync
from shardstream.pack.options import PackOptions
from shardstream.pack.shard import ShardResult
from shardstream.pack.sources.base import is_local
from shardstream.storage import Storage
from shardstream.storage.local import TEMP_PREFIX, local_path

__all__ = ["SHARD_NAME_RE", "DatasetTarget", "build_manifest", "writer_name"]

# Every name a shardstream pack writes at the top of a dataset folder.
SHARD_NAME_RE = re.compile(r"^(?:part-\d{5}-)?shard-\d{6}\.(?:tar|parquet)(?:\.idx)?$")
PART_RECORD_RE = re.compile(r"^part-(\d{5})-of-(\d{5})\.json$")
# What ``Storage.writer`` names a local file in flight: the prefix, a random part, the target's name.
_TEMP_RE = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]+-(.+)$")


def writer_name() -> str:
    return f"shardstream {__version__}"


def build_manifest(format: str, results: list[ShardResult]) -> Manifest:
    """The manifest of shards ``results`` (in order): fields are the union over shards."""
    fields: set[str] = set()
    schema: dict[str, str] = {}
    for result in results:
        fields.update(result.fields)
        for column, kind in result.schema.items():
            schema.setdefault(column, kind)
    key_column = "__key__" if "__key__" in schema else None
    return Manifest(
        format=format,
        shards=tuple(r.info for r in results),
        fields=tuple(sorted(fields - {"__key__"})),
        schema=schema,
        key_column=key_column,
        writer=writer_name(),
    )


class DatasetTarget:
    """The folder a pack writes; ``prepare`` before the first shard, ``finish`` after the last."""

    def __init__(self, storage: Storage, options: PackOptions) -> None:
        self.storage = storage
        self.options = options
        self._protected: dict[str, ShardInfo] | None = None  # the old dataset, when it must stay
        self._old: set[str] = set()  # files of an old dataset being overwritten
        self._prepared = False

    def prepare_once(self) -> None:
        """``prepare`` unless done already."""
        if not self._prepared:
            self.prepare()

    def prepare(self) -> None:
        """Look at what the destination holds; with overwrite, delete its manifest."""
        self._prepared = True
        self._remove_stale_temp_files()
        old = self._old_manifest()
        if old is None:
            return
        if self.options.overwrite:
            self.storage.delete(MANIFEST_NAME)
            self._old = {path for s in old.shards for path in (s.path, s.index)}
            return
        if old.format != self.options.format:
            raise self._refusal(f"it holds a {old.format} dataset and this pack writes {self.options.format}")
        self._protected = {s.path: s for s in old.shards}

    def _remove_stale_temp_files(self) -> None:
        """Delete the temp files of this pack's shards that a killed run left (local folders only).

        Remote writes spool outside the dataset, so only a local destination can hold
        them; a part removes only its own, since other parts may be writing theirs.
        """
        url = self.storage.url
        if not is_local(url):
            return
        root = local_path(url)
        try:
            names = os.listdir(root)
        except OSError:
            return
        for name in names:
            match = _TEMP_RE.match(name)
            if (
                match
                and SHARD_NAME_RE.match(match.group(1))
                and match.group(1).startswith(self.options.prefix)
            ):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(root, name))

    def _old_manifest(self) -> Manifest | None:
        if not self.storage.exists(MANIFEST_NAME):
            return None
        try:
            return self.storage.read_manifest()
        except ManifestError as error:
            if self.options.overwrite:
                return Manifest(format=self.options.format, shards=())
            raise self._refusal(f"its manifest is unreadable ({error.message})") from None

    def _refusal(self, why: str) -> UsageError:
        return UsageError(
            f"the destination holds another dataset: {why}; pass overwrite=True (--overwrite) to replace it",
            url=self.storage.url,
        )

    def expected(self, name: str) -> ShardInfo | None:
        """The old manifest's entry that shard ``name`` must match, if the old dataset must stay."""
        if self._protected is None:
            return None
        info = self._protected.get(name)
        if info is None:
            raise self._refusal(f"it has no shard {name}")
        return info

    def finish(self, results: list[ShardResult], sync: ShardSync) -> Manifest:
        """Remove what is stale, make the shards durable, then write the manifest (or the part's record)."""
        manifest = build_manifest(self.options.format, results)
        names = {path for s in manifest.shards for path in (s.path, s.index)}
        prefix = self.options.prefix
        if self._protected is not None:
            ours = {p for p in self._protected if p.startswith(prefix)}
            if ours != {s.path for s in manifest.shards}:
                raise self._refusal(
                    f"it has {len(ours)} shards named {prefix}*, this pack {len(manifest.shards)}"
                )
        for path in self.storage.list_files():
            stale = SHARD_NAME_RE.match(path) and (path.startswith(prefix) or path in self._old)
            record = self.options.part is None and bool(self._old) and PART_RECORD_RE.match(path)
            if (stale and path not in names) or record:
                self.storage.delete(path)
        sync.finish(names)  # NOTE [ Durable before the manifest ] in ``durable``
        part = self.options.part
        if part is None:
            self.storage.write_manifest(manifest)
        else:
            self.storage.write(part.record, manifest.to_json().encode())
        return manifest
