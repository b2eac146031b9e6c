"""The destination of a pack: what it held before, and the manifest written last.

Rules (``pack`` and ``ShardWriter`` alike):
- one pack (or one pack per ``--part``) writes a destination at a time: it holds a
  lease there from before it touches anything until its manifest is written (NOTE
  [ One pack per destination ] in ``lock``);
- no manifest there: shards already at their final names are reused when identical
  (a killed pack restarted; see NOTE [ Restartable shards ] in ``shard``), replaced
  otherwise, but only when an unfinished run of this same pack wrote them (NOTE
  [ Packs in progress ]); a file with a shard's name that nothing says we wrote is
  refused before anything changes;
- a manifest there, no ``overwrite``: the pack may only rewrite the same dataset: a
  shard that would differ from the manifest's (or a shard it does not list) is refused
  before anything changes;
- ``overwrite``: the manifest is deleted first (from then on no half dataset is
  readable; a part deletes its part record too, so ``index`` sees it unfinished), and
  the old dataset's shards that the new one does not reuse are deleted at the end; a
  part deletes only its own shards and a whole dataset's, never another part's, which
  another machine may be writing at the same time.
Only names that shardstream writes are ever deleted.

# NOTE [ Packs in progress ]
# A folder with shard-named files and no manifest may hold the shards of a killed pack
# (to be reused or replaced by its rerun) or another tool's shards: WebDataset's
# ShardWriter names its tars ``shard-%06d.tar`` too, and deleting those is data loss.
# The shard files alone cannot tell which. So a pack, once it holds the lease and
# before it writes a shard, writes a record of itself, ``.shardstream-pack.json``
# (``.shardstream-pack-part-IIIII.json`` for a part): its source and the options that
# decide the shards' bytes and names. The record is deleted only after the manifest
# (or the part's record) is written, so it outlives a crash, an exception and a
# SIGKILL. A later pack without ``overwrite`` may replace or delete files with its
# shard names only if a manifest (or this part's record) lists them, or if the record
# there is of the same pack (same source and options): an interrupted run of it wrote
# them. Any other file with such a name is foreign, and the pack refuses, naming it,
# before anything changes. A record of a pack with other options is not this pack's:
# its files are refused too (rerun that pack, or pass ``overwrite``). With
# ``overwrite`` the record lists the old dataset's files, so that a rerun of an
# interrupted overwrite still removes them.
"""

from __future__ import annotations

import json
from typing import Any

from shardstream.diagnose import no_destination
from shardstream.errors import ManifestError, ShardstreamError, StorageError, UsageError
from shardstream.folder import (
    META_FOLDER,
    PART_RECORD_RE,
    PART_SHARD_RE,
    ShardResult,
    build_manifest,
    legacy_part_record_name,
    own_name,
    pack_record_name,
    part_scope,
    shard_name_re,
    writer_name,
)
from shardstream.folder import (
    PACK_RECORD_RE as PACK_RECORD_RE,
)
from shardstream.folder import (
    SHARD_NAME_RE as SHARD_NAME_RE,
)
from shardstream.lock import PackLease, write_unsynced
from shardstream.manifest import LEGACY_MANIFEST_NAME, MANIFEST_NAME, Manifest, ShardInfo
from shardstream.pack.durable import ShardSync
from shardstream.pack.options import PackOptions
from shardstream.storage import Storage, absolute_url

# The names a pack writes are rules of ``shardstream.folder``, which ``index`` reads back
# too; those ``index`` imported from here before stay importable.


class DatasetTarget:
    """The folder a pack writes; ``prepare`` before the first shard, ``finish`` after the last.

    ``origin`` names what is packed (the source's URL; None for ``ShardWriter``): a rerun
    of the same pack may replace what an interrupted run left (NOTE [ Packs in progress ]).
    ``close`` releases the lease if ``finish`` did not.
    """

    def __init__(self, storage: Storage, options: PackOptions, *, origin: str | None = None) -> None:
        self.storage = storage
        self.options = options
        self.origin = origin
        self._protected: dict[str, ShardInfo] | None = None  # the old dataset, when it must stay
        self._old: set[str] = set()  # files of an old dataset being overwritten
        self._prepared = False
        part = options.part
        scope = part_scope(None if part is None else part.index)
        self.record = pack_record_name(scope)
        self._lease = PackLease(storage, scope)

    def prepare_once(self) -> None:
        """``prepare`` unless done already."""
        if not self._prepared:
            self.prepare()

    def prepare(self) -> None:
        """Take the lease; look at what the destination holds; with overwrite, delete its manifest."""
        self._prepared = True
        try:
            self._lease.acquire()  # the first request to the destination: it lists the folder
        except StorageError as error:
            named = no_destination(self.storage, error)
            if named is error:
                raise
            raise named from None
        try:
            self._prepare()
        except BaseException:
            self.close(cleanup=True)
            raise

    def _prepare(self) -> None:
        self._remove_stale_temp_files()
        found = self._old_manifest()
        name, old = found if found is not None else (None, None)
        record = self._read_record()
        same_pack = record is not None and record.get("pack") == self._identity()
        if not self.options.overwrite:
            self._refuse_foreign(old, record, same_pack)
            if old is not None and old.format != self.options.format:
                raise self._refusal(
                    f"it holds a {old.format} dataset and this pack writes {self.options.format}"
                )
        if same_pack and record is not None:
            replaces = record.get("replaces")
            self._old = {p for p in replaces if isinstance(p, str)} if isinstance(replaces, list) else set()
        if old is not None and self.options.overwrite:
            self._old |= {path for s in old.shards for path in (s.path, s.index)}
        self._old = {p for p in self._old if self._may_replace(p)}
        self._write_record()  # after every refusal: a refused pack leaves no record
        if old is None or name is None:
            return
        if self.options.overwrite:
            self._lease.ensure()
            self.storage.delete(name)
            if self.options.part is not None:  # the part is unfinished now: ``index`` must not join it
                self.storage.delete(self.options.part.record)
            return
        self._protected = {s.path: s for s in old.shards}

    def _may_replace(self, path: str) -> bool:
        """Whether an old dataset's file is this pack's to delete: a part deletes only its own
        shards and a whole dataset's, never another part's (which may be being written now)."""
        part = self.options.part
        return part is None or own_name(path).startswith(self.options.prefix) or not PART_SHARD_RE.match(path)

    def close(self, *, cleanup: bool = False) -> None:
        """Release the lease (the record of the pack in progress stays: a rerun resumes).

        ``cleanup``: on an error path, a claim that cannot be deleted is logged, not raised.
        """
        self._lease.release(cleanup=cleanup)

    def fence(self) -> None:
        """Raise, with no I/O, once this pack's lease lags (before a shard is stored or reused)."""
        self._lease.ensure()

    def _identity(self) -> dict[str, Any]:
        """What decides this pack's shards: a rerun with the same may take over its files."""
        options = self.options
        part = options.part
        identity = {
            "source": None if self.origin is None else absolute_url(self.origin),
            "format": options.format,
            "shard_size": options.shard_size,
            "samples_per_shard": options.samples_per_shard,
            "compression": options.compression,
            "part": None if part is None else f"{part.index}/{part.count}",
        }
        if options.tokenizing is not None:  # only then: the records of other packs stay as they were
            identity.update(options.tokenizing.identity())
        return identity

    def _read_record(self) -> dict[str, Any] | None:
        try:
            if not self.storage.exists(self.record):
                return None
            doc = json.loads(self.storage.read(self.record))
        except (ShardstreamError, ValueError, RecursionError):
            return None  # unreadable: it proves nothing, so nothing is taken as ours
        return doc if isinstance(doc, dict) else None

    def _write_record(self) -> None:
        doc = {"version": 1, "writer": writer_name(), "pack": self._identity(), "replaces": sorted(self._old)}
        write_unsynced(self.storage, self.record, json.dumps(doc, indent=1).encode())

    def _refuse_foreign(self, old: Manifest | None, record: dict[str, Any] | None, same_pack: bool) -> None:
        """Refuse files with this pack's shard names that neither a manifest nor this pack's record explains."""
        if same_pack:
            return
        known = set() if old is None else {path for s in old.shards for path in (s.path, s.index)}
        prefix = self.options.prefix
        foreign = [
            p
            for p in self.storage.list_files()
            if shard_name_re().match(p) and own_name(p).startswith(prefix) and p not in known
        ]
        if not foreign:
            return
        more = f" (and {len(foreign) - 1} more like it)" if len(foreign) > 1 else ""
        if record is not None:
            why = f"an unfinished pack with other options left it ({self._differences(record)}; see {self.record})"
        elif old is not None:
            why = "the manifest there does not list it"
        else:
            why = "there is no manifest, and no record of an unfinished run of this pack"
        raise UsageError(
            f"the destination holds {foreign[0]}{more}, which this pack did not write: {why}; shardstream "
            "replaces or deletes only files it wrote: pass overwrite=True (--overwrite) to replace it, "
            "or pack into another folder",
            url=self.storage.url,
            shard=foreign[0],
        )

    def _remove_stale_temp_files(self) -> None:
        """Delete the temp files of this pack's shards, record and lock that a killed run left.

        Only a local destination holds them (remote writes spool outside the dataset);
        a part removes only its own, since other parts may be writing theirs.
        """

        def ours(target: str) -> bool:
            shard = shard_name_re().match(target) and target.startswith(self.options.prefix)
            return bool(shard) or target == self.record or self._lease.is_stale_claim(target)

        self.storage.remove_temp_files(ours)
        self.storage.remove_temp_files(ours, META_FOLDER)  # sidecars

    def _old_manifest(self) -> tuple[str, Manifest] | None:
        """The dataset there (its manifest, or for a part this part's record when there is none)."""
        part = self.options.part
        names = [MANIFEST_NAME, LEGACY_MANIFEST_NAME]
        if part is not None:
            names += [part.record, legacy_part_record_name(part.index, part.count)]
        for name in names:
            if not self.storage.exists(name):
                continue
            try:
                data = self.storage.read(name)
                return name, Manifest.from_json(data, url=self.storage.full_url(name))
            except ManifestError as error:
                if self.options.overwrite:
                    return name, Manifest(format=self.options.format, shards=())
                raise self._refusal(f"its {name} is unreadable ({error.message})") from None
        return None

    def _refusal(self, why: str) -> UsageError:
        return UsageError(
            f"the destination holds another dataset: {why}; pass overwrite=True (--overwrite) to replace it",
            url=self.storage.url,
        )

    def expected(self, name: str) -> ShardInfo | None:
        """The old manifest's entry that shard ``name`` must match, if the old dataset must stay."""
        self._lease.ensure()  # before each shard is stored or reused (NOTE [ One pack per destination ])
        if self._protected is None:
            return None
        info = self._protected.get(name)
        if info is None:
            raise self._refusal(f"it has no shard {name}{self._other_cut()}")
        return info

    def _differences(self, record: dict[str, Any]) -> str:
        """How an unfinished pack's options differ from this one's, option by option."""
        theirs, mine = record.get("pack"), self._identity()
        if not isinstance(theirs, dict):
            return "its record names no options"
        changed = [
            f"{_option(key)} {theirs.get(key)!r} there, {mine.get(key)!r} now"
            for key in sorted(set(theirs) | set(mine))
            if theirs.get(key) != mine.get(key)
        ]
        return "; ".join(changed) or "the same options"

    def _other_cut(self) -> str:
        """Why a rerun's shard is not in the dataset there: what that dataset's shards hold."""
        shards = list((self._protected or {}).values())
        if not shards:
            return ""
        most = max(s.samples for s in shards)
        return (
            f" (its {len(shards)} shards hold up to {most:,} samples: it was packed from another "
            "source or with other --samples-per-shard, --shard-size or --compression; the same "
            "source and options give the same shards)"
        )

    def finish(self, results: list[ShardResult], sync: ShardSync) -> Manifest:
        """Remove what is stale, make the shards durable, then write the manifest (or the part's record)."""
        self._lease.check()  # nothing is deleted, nor a manifest written, by a pack taken over
        tokenizing = self.options.tokenizing
        manifest = build_manifest(
            self.options.format, results, None if tokenizing is None else tokenizing.info()
        )
        names = {path for s in manifest.shards for path in (s.path, s.index)}
        prefix = self.options.prefix
        if self._protected is not None:
            ours = {p for p in self._protected if p.startswith(prefix)}
            if ours != {s.path for s in manifest.shards}:
                raise self._refusal(
                    f"it has {len(ours)} shards named {prefix}*, this pack {len(manifest.shards)}"
                )
        files = self.storage.list_files()
        part = self.options.part
        legacy = LEGACY_MANIFEST_NAME if part is None else legacy_part_record_name(part.index, part.count)
        if legacy in files:  # gone before the sidecars it lists (the legacy layout of shardstream.folder)
            self._lease.ensure()
            self.storage.delete(legacy)
        for path in files:
            stale = shard_name_re().match(path) and (own_name(path).startswith(prefix) or path in self._old)
            record = self.options.part is None and bool(self._old) and PART_RECORD_RE.match(path)
            if (stale and path not in names) or record:
                self._lease.ensure()
                self.storage.delete(path)
        sync.finish(names)  # NOTE [ Durable before the manifest ] in ``durable``
        if part is None:
            self.storage.write_manifest(manifest)
        else:
            self.storage.write(part.record, manifest.to_json().encode())
        self.storage.delete(self.record)
        self.close()
        return manifest


def _option(key: str) -> str:
    """An identity key as the command line spells it: ``samples_per_shard`` -> ``--samples-per-shard``."""
    return "--" + key.replace("_", "-")
