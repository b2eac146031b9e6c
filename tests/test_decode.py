"""Field decoders: built-ins, the registry, overrides, pickle refusal, errors.

The round trip of every type through pack and stream is at the end of this file.
"""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream.dataset.decode import (
    PickleRefusedError,
    SampleDecoder,
    decoders,
    field_extension,
    register_decoder,
)
from shardstream.errors import FormatError, UsageError


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def image_bytes(array: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt)
    return buf.getvalue()


def pt_bytes(value) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def test_field_extension():
    assert field_extension("txt") == "txt"
    assert field_extension("seg.PNG") == "png"


def test_builtins_decode_every_type():
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    rgb = np.random.default_rng(0).integers(0, 255, (5, 6, 3), dtype=np.uint8)
    sample = {
        "__key__": "k",
        "txt": "héllo".encode(),
        "json": b'{"a": [1, 2]}',
        "cls": b" 7\n",
        "npy": npy_bytes(array),
        "png": image_bytes(rgb, "PNG"),
        "pt": pt_bytes({"w": torch.ones(2)}),
        "bin": b"\x00\x01",
    }
    out = SampleDecoder.build()(sample)
    assert out["__key__"] == "k"
    assert out["txt"] == "héllo"
    assert out["json"] == {"a": [1, 2]}
    assert out["cls"] == 7
    np.testing.assert_array_equal(out["npy"], array)
    np.testing.assert_array_equal(out["png"], rgb)
    assert torch.equal(out["pt"]["w"], torch.ones(2))
    assert out["bin"] == b"\x00\x01"  # unknown extension: bytes unchanged


def test_memoryview_fields_become_bytes():
    data = memoryview(b"xxhello")
    assert SampleDecoder.build()({"__key__": "k", "txt": data[2:], "raw": data[:2]}) == {
        "__key__": "k",
        "txt": "hello",
        "raw": b"xx",
    }


def test_parquet_values_that_are_not_bytes_pass_through():
    sample = {"__key__": "s:0", "txt": "already text", "cls": 3, "json": [1, 2]}
    assert SampleDecoder.build()(sample) == sample


def test_pickle_refused_unless_allowed():
    sample = {"__key__": "k", "pkl": pickle.dumps({"a": 1})}
    with pytest.raises(PickleRefusedError) as info:
        SampleDecoder.build()(sample, url="memory://d", shard="s.tar")
    assert info.value.url == "memory://d"
    assert info.value.shard == "s.tar"
    assert "allow_pickle" in str(info.value)
    assert SampleDecoder.build(allow_pickle=True)(sample)["pkl"] == {"a": 1}


def test_pt_refuses_arbitrary_objects():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(FormatError, match="cannot decode field 'pt'"):
        SampleDecoder.build()({"__key__": "k", "pt": pt_bytes(Evil())})


def test_npy_refuses_object_arrays():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError):
        SampleDecoder.build()({"__key__": "k", "npy": buf.getvalue()})


def test_corrupt_field_raises_format_error_naming_key_and_shard():
    with pytest.raises(FormatError) as info:
        SampleDecoder.build()({"__key__": "k1", "json": b"{not json"}, url="u", shard="s")
    assert "k1" in str(info.value)
    assert (info.value.url, info.value.shard) == ("u", "s")


def test_user_overrides_win_and_registry_is_snapshot():
    decoder = SampleDecoder.build({"txt": bytes, ".CLS": bytes.lower})
    assert decoder({"__key__": "k", "txt": b"a", "cls": b"1"}) == {"__key__": "k", "txt": b"a", "cls": b"1"}
    before = SampleDecoder.build()
    register_decoder("shardstreamtestext", bytes.upper)
    try:
        assert "shardstreamtestext" in decoders()
        assert (
            SampleDecoder.build()({"__key__": "k", "shardstreamtestext": b"a"})["shardstreamtestext"] == b"A"
        )
        assert before({"__key__": "k", "shardstreamtestext": b"a"})["shardstreamtestext"] == b"a"
    finally:
        from shardstream.dataset import decode as module

        del module._REGISTRY["shardstreamtestext"]


def test_registry_view_is_read_only():
    with pytest.raises(TypeError):
        decoders()["txt"] = bytes  # type: ignore[index]


@pytest.mark.parametrize(("ext", "fn"), [("", bytes), ("a.b", bytes), ("txt", "not callable")])
def test_register_decoder_validates(ext, fn):
    with pytest.raises(UsageError):
        register_decoder(ext, fn)


def test_sample_decoder_pickles():
    decoder = SampleDecoder.build(allow_pickle=True)
    again = pickle.loads(pickle.dumps(decoder))
    assert again == decoder
    assert again({"__key__": "k", "json": b"[1]"}) == {"__key__": "k", "json": [1]}


def test_json_text_integers_round_trip_values():
    decoder = SampleDecoder.build()
    payload = {"x": [1, 2.5, None, "é"]}
    assert decoder({"__key__": "k", "meta.json": json.dumps(payload).encode()})["meta.json"] == payload


# -- round trips through pack and stream ------------------------------------------------------


def test_every_type_round_trips_through_a_tar_dataset(tmp_path):
    import shardstream
    from shardstream.pack import ShardWriter

    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
    images = [rng.integers(0, 255, (6, 5, 3), dtype=np.uint8) for _ in range(3)]
    url = str(tmp_path / "ds")
    with ShardWriter(url, format="tar", samples_per_shard=2) as writer:
        for i in range(3):
            buf = io.BytesIO()
            np.savez(buf, a=arrays[i], b=np.arange(i + 1))
            writer.write(
                {
                    "__key__": f"s{i}",
                    "txt": f"text {i} é",
                    "json": json.dumps({"i": i, "tags": ["a", "b"]}).encode(),
                    "cls": i,
                    "npy": npy_bytes(arrays[i]),
                    "npz": buf.getvalue(),
                    "png": image_bytes(images[i], "PNG"),
                    "jpg": image_bytes(images[i], "JPEG"),
                    "gray.png": image_bytes(images[i][:, :, 0], "PNG"),
                    "pt": pt_bytes({"t": torch.full((2,), float(i))}),
                    "bin": bytes([i]) * 3,
                }
            )
    samples = {s["__key__"]: s for s in shardstream.StreamingDataset(url)}
    assert sorted(samples) == ["s0", "s1", "s2"]
    for i in range(3):
        s = samples[f"s{i}"]
        assert s["txt"] == f"text {i} é"
        assert s["json"] == {"i": i, "tags": ["a", "b"]}
        assert s["cls"] == i
        np.testing.assert_array_equal(s["npy"], arrays[i])
        np.testing.assert_array_equal(s["npz"]["a"], arrays[i])
        np.testing.assert_array_equal(s["npz"]["b"], np.arange(i + 1))
        np.testing.assert_array_equal(s["png"], images[i])
        assert s["jpg"].shape == images[i].shape
        assert s["jpg"].dtype == np.uint8
        np.testing.assert_array_equal(s["gray.png"], images[i][:, :, 0])
        assert torch.equal(s["pt"]["t"], torch.full((2,), float(i)))
        assert s["bin"] == bytes([i]) * 3
    raw = {s["__key__"]: s for s in shardstream.StreamingDataset(url, decode=False)}
    assert raw["s1"]["cls"] == b"1"
    assert raw["s1"]["npy"] == npy_bytes(arrays[1])


def test_parquet_columns_round_trip_and_binary_columns_decode_by_name(tmp_path):
    import shardstream
    from shardstream.pack import ShardWriter

    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    url = str(tmp_path / "pq")
    with ShardWriter(url, format="parquet", samples_per_shard=2) as writer:
        for i in range(3):
            writer.write(
                {
                    "__key__": f"r{i}",
                    "text": f"row {i}",
                    "n": i,
                    "x": i / 2,
                    "ids": [i, i + 1],
                    "image.png": image_bytes(image + i, "PNG"),
                    "meta.json": json.dumps({"i": i}).encode(),
                }
            )
    rows = {s["__key__"]: s for s in shardstream.StreamingDataset(url)}
    for i in range(3):
        row = rows[f"r{i}"]
        assert (row["text"], row["n"], row["x"], row["ids"]) == (f"row {i}", i, i / 2, [i, i + 1])
        np.testing.assert_array_equal(row["image.png"], image + i)
        assert row["meta.json"] == {"i": i}


def test_pickle_round_trip_needs_allow_pickle(tmp_path):
    import shardstream
    from shardstream.pack import ShardWriter

    url = str(tmp_path / "pkl")
    with ShardWriter(url, format="tar", samples_per_shard=4) as writer:
        writer.write({"__key__": "p", "pkl": pickle.dumps({"a": (1, 2)})})
    with pytest.raises(PickleRefusedError):
        list(shardstream.StreamingDataset(url))
    assert list(shardstream.StreamingDataset(url, allow_pickle=True)) == [
        {"__key__": "p", "pkl": {"a": (1, 2)}}
    ]
    # a user decoder for the extension is an explicit choice
    assert list(shardstream.StreamingDataset(url, decoders={"pkl": len})) == [
        {"__key__": "p", "pkl": len(pickle.dumps({"a": (1, 2)}))}
    ]
