"""The rough edges a new user meets first: errors that say what is wrong and what to do,
image arrays torch takes without a warning, a missing optional package named by its
extra, a missing key that is a ``KeyError`` and a ``ShardstreamError``."""

from __future__ import annotations

import builtins
import io
import json
import pickle

import numpy as np
import pytest

import shardstream
from shardstream.dataset.decode import decoders
from shardstream.errors import (
    KeyNotFoundError,
    MissingDependencyError,
    NotADatasetError,
    ShardstreamError,
    UsageError,
)
from shardstream.pack import ShardWriter, pack


def write(url, count: int = 12) -> None:
    with ShardWriter(url, format="tar", samples_per_shard=5) as writer:
        for i in range(count):
            writer.write({"__key__": f"k{i:03d}", "txt": f"text {i}"})


# -- not a dataset: which case, and what to do ------------------------------------------


def not_a_dataset(url) -> str:
    with pytest.raises(NotADatasetError) as info:
        shardstream.inspect_dataset(str(url))
    return str(info.value)


def test_a_missing_folder_is_called_missing(tmp_path):
    text = not_a_dataset(tmp_path / "typo")
    assert "nothing is there" in text
    assert "shardstream index" not in text


def test_an_empty_folder_is_called_empty(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "the folder is empty" in not_a_dataset(tmp_path / "empty")


def test_a_folder_of_raw_files_says_to_pack_it(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("x")
    (raw / "a.cls").write_text("1")
    text = not_a_dataset(raw)
    assert "holds no shards (*.tar, *.parquet" in text
    assert "but 2 other entries" in text
    assert f"shardstream pack {raw} DEST" in text


def test_shards_without_a_manifest_say_to_index_them(tmp_path):
    url = tmp_path / "ds"
    write(url)
    (url / ".shardstream" / "manifest.json").unlink()
    text = not_a_dataset(url)
    assert "holds 3 shard files but no manifest" in text
    assert f"shardstream index {url}" in text


def test_an_unfinished_pack_says_to_rerun_it(tmp_path):
    url = tmp_path / "ds"
    write(url)
    (url / ".shardstream" / "manifest.json").unlink()
    (url / ".shardstream-pack.json").write_text("{}")
    assert "run the same `shardstream pack` command again" in not_a_dataset(url)


def test_a_dataset_and_verify_say_it_too(tmp_path):
    with pytest.raises(NotADatasetError, match="nothing is there"):
        shardstream.verify_dataset(str(tmp_path / "typo"))
    with pytest.raises(NotADatasetError, match="nothing is there"):
        len(shardstream.StreamingDataset(str(tmp_path / "typo")))


@pytest.mark.s3
def test_a_missing_bucket_is_called_a_missing_bucket():
    from shardstream.testing import MotoServer

    server = MotoServer()
    server.start()
    try:
        server.create_bucket("there")
        options = server.storage_options()
        with pytest.raises(NotADatasetError, match="the bucket 'nobucket' does not exist"):
            shardstream.inspect_dataset("s3://nobucket/corpus", storage_options=options)
        with pytest.raises(NotADatasetError, match="nothing is there"):
            shardstream.inspect_dataset("s3://there/typo", storage_options=options)
    finally:
        server.stop()


# -- keys ---------------------------------------------------------------------------------


def test_a_missing_key_is_a_keyerror_and_a_shardstream_error(tmp_path):
    url = str(tmp_path / "ds")
    write(url)
    dataset = shardstream.MapDataset(url)
    assert dataset.index_of("k007") == 7
    for key in ("no-such-key", 3):
        with pytest.raises(KeyNotFoundError) as info:
            dataset.index_of(key)  # type: ignore[arg-type]
        assert isinstance(info.value, KeyError)
        assert isinstance(info.value, ShardstreamError)
        assert url in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))  # it crosses DataLoader workers whole
    assert type(again) is KeyNotFoundError
    assert str(again) == str(info.value)


# -- images ---------------------------------------------------------------------------------


def png(array: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="png")
    return buffer.getvalue()


def test_a_decoded_image_is_a_writable_array():
    array = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    decoded = decoders()["png"](png(array))
    assert decoded.flags.writeable
    np.testing.assert_array_equal(decoded, array)


def test_without_pillow_an_image_names_the_extra_to_install(monkeypatch):
    data = png(np.zeros((2, 2, 3), dtype=np.uint8))
    real_import = builtins.__import__

    def no_pillow(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ModuleNotFoundError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pillow)
    with pytest.raises(MissingDependencyError) as info:
        decoders()["jpg"](data)
    assert "pip install 'shardstream[image]'" in str(info.value)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, UsageError)


@pytest.mark.s3
def test_a_pack_into_a_missing_bucket_names_the_bucket(tmp_path):
    from shardstream.testing import MotoServer

    (tmp_path / "c.jsonl").write_text('{"txt": "a"}\n')
    server = MotoServer()
    server.start()
    try:
        with pytest.raises(UsageError, match="the bucket 'nobucket' does not exist"):
            pack(tmp_path / "c.jsonl", "s3://nobucket/corpus", storage_options=server.storage_options())
    finally:
        server.stop()


# -- a rerun with other options: which option -------------------------------------------


def test_a_rerun_with_other_options_names_them(tmp_path):
    source = tmp_path / "c.jsonl"
    source.write_text("".join(f'{{"txt": "text {i}"}}\n' for i in range(30)))
    dest = tmp_path / "ds"
    pack(source, dest, samples_per_shard=8, workers=1)
    with pytest.raises(UsageError) as info:
        pack(source, dest, samples_per_shard=10, workers=1)
    text = str(info.value)
    assert "there 8 samples" in text
    assert "this pack's 10 samples" in text
    assert "--samples-per-shard" in text
    # an unfinished pack (no manifest, its record there) names each option that differs
    (dest / ".shardstream" / "manifest.json").unlink()
    record = {"version": 1, "pack": {"format": "tar", "samples_per_shard": 8, "source": str(source)}}
    (dest / ".shardstream-pack.json").write_text(json.dumps(record))
    with pytest.raises(UsageError, match="--samples-per-shard 8 there, 10 now") as info:
        pack(source, dest, samples_per_shard=10, workers=1)
    assert "--format" not in str(info.value)


def test_index_of_a_missing_folder_says_nothing_is_there_and_makes_no_folder(tmp_path):
    from shardstream.catalog import index_dataset

    with pytest.raises(UsageError, match=r"cannot index .*: nothing is there"):
        index_dataset(str(tmp_path / "typo"))
    assert not (tmp_path / "typo").exists()
