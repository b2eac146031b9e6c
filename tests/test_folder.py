"""The dataset layout: the names a pack writes are those that datasets, parts, records
and claims written before carry (a rerun resumes them, ``index`` joins them), each
pattern matches what its name rule makes, and the old import paths still work."""

from __future__ import annotations

import json

import pytest

import shardstream
from shardstream import folder
from shardstream._version import __version__
from shardstream.catalog import index_dataset
from shardstream.errors import PackError
from shardstream.lock import PackLease
from shardstream.manifest import Manifest, ShardInfo
from shardstream.pack import ShardWriter
from shardstream.pack.options import PackOptions, Part
from shardstream.storage import Storage


def test_names_are_those_written_before():
    assert folder.shard_name(folder.SHARD_PREFIX, 3, ".tar") == "shard-000003.tar"
    assert folder.shard_name(folder.part_prefix(2), 1, ".parquet") == "part-00002-shard-000001.parquet"
    assert folder.sidecar_name("shard-000003.tar") == ".shardstream/shard-000003.tar.idx"
    assert folder.part_record_name(1, 4) == ".shardstream/part-00001-of-00004.json"
    assert folder.legacy_part_record_name(1, 4) == "part-00001-of-00004.json"
    assert folder.MANIFEST_NAME == ".shardstream/manifest.json"
    assert folder.LEGACY_MANIFEST_NAME == "manifest.json"
    assert folder.pack_record_name(folder.part_scope(None)) == ".shardstream-pack.json"
    assert folder.pack_record_name(folder.part_scope(7)) == ".shardstream-pack-part-00007.json"
    assert folder.claim_name(folder.part_scope(3), "ab12") == ".shardstream-lock-part-00003.ab12.json"
    assert folder.writer_name() == f"shardstream {__version__}" == f"shardstream {shardstream.__version__}"


def test_pack_options_name_shards_by_the_layout():
    options = PackOptions(format="parquet", part=Part(4, 9))
    assert options.shard_name(12) == "part-00004-shard-000012.parquet"
    assert options.part is not None
    assert options.part.record == ".shardstream/part-00004-of-00009.json"
    assert PackOptions().shard_name(0) == "shard-000000.tar"


@pytest.mark.parametrize("number", [0, 1, 999999])
@pytest.mark.parametrize("part", [None, 0, 12345])
@pytest.mark.parametrize("suffix", [".tar", ".parquet"])
def test_patterns_match_what_the_rules_make(number, part, suffix):
    prefix = folder.SHARD_PREFIX if part is None else folder.part_prefix(part)
    shard = folder.shard_name(prefix, number, suffix)
    assert folder.SHARD_NAME_RE.match(shard)
    for sidecar in (folder.sidecar_name(shard), shard + ".idx"):  # this layout's and the legacy one's
        assert folder.SHARD_NAME_RE.match(sidecar)
        assert folder.own_name(sidecar) == shard + ".idx"
        sidecar_part = folder.PART_SHARD_RE.match(sidecar)
        assert (None if sidecar_part is None else int(sidecar_part.group(1))) == part
    assert folder.own_name(shard) == shard
    match = folder.PART_SHARD_RE.match(shard)
    assert (None if match is None else int(match.group(1))) == part
    scope = folder.part_scope(part)
    record = folder.PACK_RECORD_RE.match(folder.pack_record_name(scope))
    assert record is not None
    assert (None if record.group(1) is None else int(record.group(1))) == part
    claim = folder.CLAIM_RE.match(folder.claim_name(scope, "0f" * 8))
    assert claim is not None
    assert (claim.group(1) or "", claim.group(2)) == (scope, "0f" * 8)
    if part is not None:
        for name in (folder.part_record_name(part, part + 1), folder.legacy_part_record_name(part, part + 1)):
            finished = folder.PART_RECORD_RE.match(name)
            assert finished is not None
            assert finished.groups() == (f"{part:05d}", f"{part + 1:05d}")


@pytest.mark.parametrize(
    "name",
    [
        "shard-00003.tar",
        "shard-000003.tar.gz",
        "other-000003.tar",
        "part-0001-shard-000001.tar",
        "manifest.json",
        ".shardstream/manifest.json",
        ".shardstream/shard-000003.tar",
        "sub/shard-000003.tar.idx",
    ],
)
def test_other_names_are_not_shards(name):
    assert not folder.SHARD_NAME_RE.match(name)
    assert not folder.PART_SHARD_RE.match(name)


def test_build_manifest_unions_fields_and_refuses_a_column_of_two_types():
    def result(name, fields, schema):
        info = ShardInfo(name, 1, 10, "0" * 64, folder.sidecar_name(name), 5)
        return folder.ShardResult(info, fields, schema)

    with pytest.raises(PackError, match=r"column 'txt' is string in shard-000000\.parquet but binary"):
        folder.build_manifest(
            "parquet",
            [
                result("shard-000000.parquet", ("txt",), {"txt": "string"}),
                result("shard-000001.parquet", ("txt",), {"txt": "binary"}),
            ],
        )
    manifest = folder.build_manifest(
        "parquet",
        [
            result("shard-000000.parquet", ("txt", "__key__"), {"__key__": "string", "txt": "string"}),
            result("shard-000001.parquet", ("cls",), {"txt": "string", "cls": "int64"}),
        ],
    )
    assert [s.path for s in manifest.shards] == ["shard-000000.parquet", "shard-000001.parquet"]
    assert manifest.fields == ("cls", "txt")
    assert manifest.schema == {"__key__": "string", "txt": "string", "cls": "int64"}
    assert manifest.key_column == "__key__"
    assert manifest.writer == folder.writer_name()
    assert Manifest.from_json(manifest.to_json(), url="memory://x").to_json() == manifest.to_json()


def test_old_import_paths_still_work():
    from shardstream.pack import dest, lock, shard

    assert lock.PackLease is PackLease
    assert dest.build_manifest is folder.build_manifest
    assert dest.writer_name is folder.writer_name
    assert dest.SHARD_NAME_RE is folder.SHARD_NAME_RE
    assert dest.PACK_RECORD_RE is folder.PACK_RECORD_RE
    assert dest.PART_RECORD_RE is folder.PART_RECORD_RE
    assert shard.ShardResult is folder.ShardResult
    assert callable(shard.checks_of)
    assert callable(shard.sha256_of)
    from shardstream import catalog

    assert shardstream.index_dataset is catalog.index_dataset is index_dataset
    assert catalog.inspect_dataset.__module__ == "shardstream.catalog.inspect"
    assert catalog.verify_dataset.__module__ == "shardstream.catalog.verify"
    assert {"DatasetSummary", "ShardProblem", "VerifyReport"} <= set(catalog.__all__)


def test_a_pack_and_index_write_the_writer_and_names_of_the_layout(tmp_path):
    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=2) as writer:
        for i in range(5):
            writer.write({"__key__": f"k{i}", "txt": b"x" * i})
    doc = json.loads((tmp_path / "ds" / ".shardstream" / "manifest.json").read_text())
    assert doc["writer"] == folder.writer_name()
    assert [s["path"] for s in doc["shards"]] == [f"shard-{i:06d}.tar" for i in range(3)]
    assert [s["index"] for s in doc["shards"]] == [f".shardstream/shard-{i:06d}.tar.idx" for i in range(3)]
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [
        ".shardstream",
        *(f"shard-{i:06d}.tar" for i in range(3)),
    ]
    (tmp_path / "ds" / ".shardstream" / "manifest.json").unlink()
    manifest = index_dataset(str(tmp_path / "ds"), threads=1)
    assert manifest.writer == folder.writer_name()
    assert [s.index for s in manifest.shards] == [f".shardstream/shard-{i:06d}.tar.idx" for i in range(3)]
    storage = Storage(str(tmp_path / "ds"))
    try:
        assert not [p for p in storage.list_files() if folder.CLAIM_RE.match(p)]  # the lease was released
    finally:
        storage.close()
