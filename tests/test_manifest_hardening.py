"""Manifests that would serve wrong data are refused when loaded (issue 10, item 8).

Real datasets packed to local disk; each hostile manifest is the packed one edited as a
person or a broken tool would, then read the ways a user reads it (``Manifest.from_json``,
``StreamingDataset``, ``verify``).
"""

from __future__ import annotations

import json
import pickle

import pytest

import shardstream
from shardstream import StreamingDataset
from shardstream.catalog import index_dataset, verify_dataset
from shardstream.errors import ManifestError, ShardstreamError
from shardstream.manifest import Manifest
from shardstream.pack import ShardWriter, pack


@pytest.fixture
def packed(tmp_path):
    """A 3-shard tar dataset of 25 samples; returns its folder."""
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"txt": f"sample {i}"}) + "\n" for i in range(25)))
    pack(tmp_path / "c.jsonl", tmp_path / "ds", samples_per_shard=10, workers=1)
    return tmp_path / "ds"


def edit(folder, change) -> None:
    """Rewrite ``folder``'s manifest.json with ``change(dict)`` applied."""
    path = folder / ".shardstream" / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def refused(folder, match: str) -> ManifestError:
    """The error every way of reading the manifest gives (they must agree)."""
    with pytest.raises(ManifestError, match=match) as loaded:
        Manifest.from_json((folder / ".shardstream" / "manifest.json").read_text(), url="ds/manifest.json")
    with pytest.raises(ManifestError, match=match):
        StreamingDataset(str(folder), shuffle=False).manifest  # noqa: B018
    with pytest.raises(ManifestError, match=match):
        verify_dataset(str(folder))
    assert loaded.value.url == "ds/manifest.json"
    return loaded.value


def test_packed_and_indexed_manifests_still_load(packed, tmp_path):
    manifest = Manifest.from_json((packed / ".shardstream" / "manifest.json").read_text())
    assert (len(manifest.shards), manifest.num_samples) == (3, 25)
    assert verify_dataset(str(packed)).ok
    assert index_dataset(str(packed)) == manifest
    with ShardWriter(tmp_path / "pq", samples_per_shard=4, format="parquet") as writer:
        for i in range(9):
            writer.write({"__key__": f"k{i}", "txt": f"row {i}"})
    assert StreamingDataset(str(tmp_path / "pq"), shuffle=False).manifest.num_samples == 9
    # an empty dataset is a dataset (a pack of nothing), and old manifests without totals load
    assert Manifest.from_json(json.dumps({"version": 1, "format": "tar", "shards": []})).shards == ()


def test_a_shard_listed_twice_is_refused(packed):
    def twice(data):
        data["shards"].append(dict(data["shards"][0]))
        data["num_shards"] += 1
        data["num_samples"] += data["shards"][0]["samples"]
        data["num_bytes"] += data["shards"][0]["bytes"]

    edit(packed, twice)
    error = refused(packed, "lists shard path 'shard-000000.tar' twice")
    assert error.shard == "shard-000000.tar"


def test_two_shards_sharing_a_sidecar_are_refused(packed):
    def share(data):
        data["shards"][1]["index"] = data["shards"][0]["index"]

    edit(packed, share)
    assert (
        refused(packed, "sample index path '.shardstream/shard-000000.tar.idx' twice").shard
        == "shard-000001.tar"
    )


@pytest.mark.parametrize("field", ["samples", "bytes", "index_bytes"])
@pytest.mark.parametrize("value", [9.9, 10.0, True, "10", -1, 1 << 63, None])
def test_a_count_that_is_not_a_json_integer_is_refused(packed, field, value):
    def spoil(data):
        data["shards"][1][field] = value

    edit(packed, spoil)
    # check_int's words: what is wrong with it (not an integer, below 0, too large)
    error = refused(packed, f"field '{field}' (must be an integer|must be at least 0|is too large)")
    assert error.shard == "shard-000001.tar"


@pytest.mark.parametrize(
    ("field", "delta"), [("num_samples", 1), ("num_samples", -5), ("num_bytes", 512), ("num_shards", 1)]
)
def test_totals_that_disagree_with_the_shards_are_refused(packed, field, delta):
    def spoil(data):
        data[field] += delta

    edit(packed, spoil)
    refused(packed, f"manifest says {field}=.*its shards add up to")


@pytest.mark.parametrize(
    ("shard_field", "value", "match"),
    [
        ("sha256", "00" * 31, "64 hex digits"),
        ("sha256", "../" * 22 + "x", "64 hex digits"),
        ("index", "../elsewhere.idx", "inside the dataset"),
        ("index", "/etc/passwd", "inside the dataset"),
        ("path", "", "inside the dataset"),
        ("path", 7, "must be a string"),
    ],
)
def test_shard_strings_are_checked(packed, shard_field, value, match):
    def spoil(data):
        data["shards"][0][shard_field] = value

    edit(packed, spoil)
    refused(packed, match)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("version", True, "version True is not supported"),
        ("version", 1.0, "version 1.0 is not supported"),
        ("fields", "txt", "list of strings"),
        ("schema", {"a": 1}, "schema"),
        ("key_column", 3, "key_column"),
        ("shards", {"0": {}}, "'shards' must be a list"),
    ],
)
def test_top_level_fields_are_checked(packed, field, value, match):
    def spoil(data):
        data[field] = value

    edit(packed, spoil)
    refused(packed, match)


def test_verify_reports_an_empty_manifest_beside_shard_files(packed):
    def empty(data):
        data.update(shards=[], num_shards=0, num_samples=0, num_bytes=0)

    edit(packed, empty)
    report = verify_dataset(str(packed))
    assert not report.ok
    assert report.bad_shards == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert all("manifest lists no shards" in p.problem for p in report.problems)


DEPTH = 100_000


@pytest.mark.parametrize(
    "nested", ["[" * DEPTH + "]" * DEPTH, '{"a":' * DEPTH + "0" + "}" * DEPTH], ids=["lists", "objects"]
)
def test_a_deeply_nested_manifest_is_a_manifest_error(packed, nested):
    text = (
        (packed / ".shardstream" / "manifest.json")
        .read_text()
        .replace('"writer":', f'"deep": {nested}, "writer":', 1)
    )
    (packed / ".shardstream" / "manifest.json").write_text(text)
    refused(packed, "nests too deeply")
    with pytest.raises(ManifestError, match="nests too deeply"):
        Manifest.from_json(nested.encode())


def test_an_error_naming_a_huge_shard_path_or_url_stays_short(packed):
    huge = "p/" + "x" * 600_000 + ".tar"

    def long_path(data):
        data["shards"][0]["path"] = huge
        data["shards"][0]["sha256"] = "not hex"

    edit(packed, long_path)
    error = refused(packed, "64 hex digits")
    assert len(str(error)) < 6000
    assert error.shard.startswith(repr(huge[:200])[:200])
    assert f"({len(huge)} characters)" in error.shard
    url = "s3://bucket/" + "u" * 600_000
    cut = ShardstreamError("gone", url=url, shard="s.tar")
    assert len(str(cut)) < 6000
    assert cut.url.startswith(repr(url)[:200])
    assert cut.shard == "s.tar"
    assert f"({len(url)} characters)" in str(cut)
    assert str(pickle.loads(pickle.dumps(cut))) == str(cut)  # cut once, not again when rebuilt
    short = "s3://bucket/" + "k" * 900  # a long but real location is kept whole
    assert ShardstreamError("gone", url=short).url == short


@pytest.mark.parametrize("make", ["StreamingDataset", "MapDataset"])
def test_a_manifest_listing_no_shards_is_refused_when_opened(packed, make):
    # issue 10: a hand-made or cut-short manifest with `shards: []` beside shard files
    # streamed nothing, every epoch, with no error
    def empty(data):
        data.update(shards=[], num_shards=0, num_samples=0, num_bytes=0)

    edit(packed, empty)
    with pytest.raises(ManifestError, match="lists no shards"):
        len(getattr(shardstream, make)(str(packed)))
