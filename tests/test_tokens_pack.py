"""Tokenizing while packing: ``pack(..., tokenizer=)`` and ``shardstream pack --tokenizer``.

A small byte-level BPE is trained here (no download). Every document's tokens must be
the tokenizer's own ids for its text (plus EOS), from JSON Lines, CSV, Parquet and a
folder of .txt files; the shards must be byte-identical for 1 and 2 workers and after a
killed pack is rerun; errors name the file and line."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.cli import main
from shardstream.errors import PackError, UsageError
from shardstream.manifest import MANIFEST_NAME, Manifest
from shardstream.pack import pack
from tests.test_pack_restart import console_script, kill, snapshot, wait_for
from tests.tokens_helpers import read_documents, texts, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def reference(tokenizer_json):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    return lambda text: next(e.ids for e in tok.encode_batch([text]))


DOCS = texts(240)


def _jsonl(path, docs=DOCS, field="text"):
    path.write_text("".join(json.dumps({field: t, "n": i}) + "\n" for i, t in enumerate(docs)))
    return path


def _check(url, docs, reference, *, eos=0):
    got = read_documents(str(url))
    assert len(got) == len(docs)
    for (_, tokens), text in zip(got, docs, strict=True):
        want = reference(text) + ([eos] if eos is not None else [])
        assert tokens.tolist() == want


def test_every_source_kind_round_trips(tmp_path, tokenizer_json, reference):
    jsonl = _jsonl(tmp_path / "a.jsonl")
    with open(tmp_path / "b.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["n", "body"])
        writer.writerows([i, t] for i, t in enumerate(DOCS))
    pq.write_table(pa.table({"text": DOCS}), tmp_path / "c.parquet")
    folder = tmp_path / "txt"
    folder.mkdir()
    for i, text in enumerate(DOCS):
        (folder / f"doc{i:04d}.txt").write_text(text, encoding="utf-8")
    for source, field in (
        (jsonl, None),
        (tmp_path / "b.csv", "body"),
        (tmp_path / "c.parquet", "text"),
        (folder, None),
    ):
        dest = tmp_path / f"ds-{source.name}"
        manifest = pack(source, dest, format="tokens", tokenizer=tokenizer_json, text_field=field, workers=1)
        assert manifest.tokens.dtype == "uint16"
        assert manifest.tokens.vocab_size == 300
        assert (manifest.tokens.eos_id, manifest.tokens.bos_id) == (0, 1)
        assert manifest.tokens.tokenizer.startswith("sha256:")
        assert manifest.num_samples == len(DOCS)
        _check(dest, DOCS, reference)


@pytest.mark.parametrize("kind", ["jsonl", "folder"])
def test_byte_identical_for_one_and_two_workers(tmp_path, tokenizer_json, kind):
    if kind == "jsonl":
        source = _jsonl(tmp_path / "a.jsonl")
    else:
        source = tmp_path / "txt"
        source.mkdir()
        for i, text in enumerate(DOCS):
            (source / f"doc{i:04d}.txt").write_text(text, encoding="utf-8")
    runs = {}
    for workers in (1, 2):
        dest = tmp_path / f"ds{workers}"
        manifest = pack(
            source, dest, format="tokens", tokenizer=tokenizer_json, shard_size="1KB", workers=workers
        )
        assert len(manifest.shards) > 3
        runs[workers] = snapshot(dest)
    assert runs[1] == runs[2]


def test_append_eos_and_parquet_input_ids(tmp_path, tokenizer_json, reference):
    source = _jsonl(tmp_path / "a.jsonl")
    pack(source, tmp_path / "no-eos", format="tokens", tokenizer=tokenizer_json, append_eos=False, workers=1)
    _check(tmp_path / "no-eos", DOCS, reference, eos=None)
    manifest = pack(source, tmp_path / "pq", format="parquet", tokenizer=tokenizer_json, workers=2)
    assert manifest.schema["input_ids"].startswith("list<")
    assert manifest.num_tokens == sum(len(reference(t)) + 1 for t in DOCS)
    duckdb = pytest.importorskip("duckdb")
    path = str(tmp_path / "pq" / "*.parquet")
    rows = duckdb.sql(f"select __key__, input_ids from read_parquet('{path}') order by __key__").fetchall()
    assert [ids for _, ids in rows] == [[*reference(t), 0] for t in DOCS]
    datasets = pytest.importorskip("datasets")
    files = sorted(str(p) for p in (tmp_path / "pq").glob("*.parquet"))
    hf = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    assert hf["input_ids"] == [[*reference(t), 0] for t in DOCS]


def test_errors_name_the_file_and_line(tmp_path, tokenizer_json, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a name that is no file is not looked up on the Hub
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(PackError, match="no text field 'text'") as caught:
        pack(bad, tmp_path / "d1", format="tokens", tokenizer=tokenizer_json, workers=1)
    assert caught.value.line == 2
    assert "bad.jsonl" in str(caught.value)
    bad.write_text('{"text": "fine"}\n{"text": "ok"}\n{"text": 12}\n')
    with pytest.raises(PackError, match="int, not a string") as caught:
        pack(bad, tmp_path / "d2", format="tokens", tokenizer=tokenizer_json, workers=2)
    assert caught.value.line == 3
    with pytest.raises(UsageError, match="cannot load tokenizer"):
        pack(bad, tmp_path / "d3", format="tokens", tokenizer=str(tmp_path / "missing" / "nothing-here"))
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(UsageError, match=r"tokenizer\.json"):
        pack(bad, tmp_path / "d4", format="tokens", tokenizer=tmp_path / "broken.json")
    with pytest.raises(UsageError, match="hold no token ids"):
        pack(bad, tmp_path / "d5", format="tar", tokenizer=tokenizer_json)
    with pytest.raises(UsageError, match="pass a tokenizer"):
        pack(bad, tmp_path / "d6", format="tokens", text_field="text")
    no_eos = train_tokenizer(tmp_path, eos=False)
    with pytest.raises(UsageError, match="no end-of-document token"):
        pack(bad, tmp_path / "d7", format="tokens", tokenizer=no_eos, append_eos=True)
    assert not any((tmp_path / f"d{i}" / MANIFEST_NAME).exists() for i in range(1, 8))


def test_cli_pack_with_a_tokenizer(tmp_path, tokenizer_json, reference, capsys):
    source = _jsonl(tmp_path / "a.jsonl", field="body")
    dest = tmp_path / "ds"
    args = ["pack", str(source), str(dest), "--format", "tokens", "--tokenizer", str(tokenizer_json)]
    args += ["--text-field", "body", "--no-append-eos", "--workers", "2", "--samples-per-shard", "50", "-q"]
    assert main(args) == 0
    _check(dest, DOCS, reference, eos=None)
    assert main(["verify", str(dest)]) == 0
    tar = ["pack", str(source), str(tmp_path / "x"), "--tokenizer", str(tokenizer_json), "--format", "tar"]
    assert main(tar) == 2
    assert "hold no token ids" in capsys.readouterr().err
    # with a tokenizer and no --format, the shards are token shards
    plain = [
        "pack",
        str(source),
        str(tmp_path / "y"),
        "--tokenizer",
        str(tokenizer_json),
        "--text-field",
        "body",
    ]
    assert main([*plain, "-q", "--workers", "1"]) == 0
    assert Manifest.from_json((tmp_path / "y" / MANIFEST_NAME).read_text()).format == "tokens"


@pytest.mark.slow
def test_killed_tokenizing_pack_reruns_to_the_same_bytes(tmp_path, tokenizer_json):
    lines = [json.dumps({"text": t}) + "\n" for t in texts(400, seed=3)]
    source = tmp_path / "corpus.jsonl"
    command = [console_script(), "pack", str(source), str(tmp_path / "ds"), "--format", "tokens"]
    command += ["--tokenizer", str(tokenizer_json), "--samples-per-shard", "20", "--workers", "2"]
    # fed through a pipe: killed while it waits for line 196, after it wrote shards 0..8
    os.mkfifo(source)
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        with open(source, "w") as feed:
            feed.writelines(lines[:195])
            feed.flush()
            shards = [tmp_path / "ds" / ".shardstream" / f"shard-{i:06d}.tokens.idx" for i in range(9)]
            wait_for(lambda: all(p.exists() for p in shards), "shards 0..8")
            kill(process)
    finally:
        if process.poll() is None:
            kill(process)
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not (tmp_path / "ds" / MANIFEST_NAME).exists()
    inodes = {i: os.stat(tmp_path / "ds" / f"shard-{i:06d}.tokens").st_ino for i in range(9)}
    source.unlink()
    source.write_text("".join(lines))
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert {i: os.stat(tmp_path / "ds" / f"shard-{i:06d}.tokens").st_ino for i in range(9)} == inodes
    clean = subprocess.run(
        [*command[:3], str(tmp_path / "clean"), *command[4:]], capture_output=True, text=True, timeout=300
    )
    assert clean.returncode == 0, clean.stderr
    assert snapshot(tmp_path / "ds") == snapshot(tmp_path / "clean")
    # another tokenizer at the same destination is another pack: refused, not mixed in
    other = train_tokenizer(tmp_path, vocab_size=280)
    again = [*command[:7], str(other), *command[8:]]
    source.write_text("".join(lines))
    assert subprocess.run(again, capture_output=True, timeout=300).returncode != 0
    assert np.array_equal(
        np.frombuffer((tmp_path / "ds" / "shard-000000.tokens").read_bytes(), np.uint16),
        np.frombuffer((tmp_path / "clean" / "shard-000000.tokens").read_bytes(), np.uint16),
    )


def test_parts_joined_by_index_keep_the_tokenizer(tmp_path, tokenizer_json, reference):
    source = _jsonl(tmp_path / "a.jsonl")
    dest = tmp_path / "ds"
    for part in ("0/2", "1/2"):
        pack(
            source,
            dest,
            format="tokens",
            tokenizer=tokenizer_json,
            part=part,
            samples_per_shard=50,
            workers=1,
        )
    from shardstream.catalog import index_dataset

    manifest = index_dataset(str(dest))
    whole = pack(source, tmp_path / "whole", format="tokens", tokenizer=tokenizer_json, workers=1)
    assert manifest.tokens == whole.tokens
    assert manifest.num_tokens == whole.num_tokens
    _check(dest, DOCS, reference)


def test_pack_tokens_to_s3(s3, tmp_path, tokenizer_json, reference):
    base, options = s3
    source = _jsonl(tmp_path / "a.jsonl")
    url = f"{base}/tokens"
    manifest = pack(
        source,
        url,
        format="tokens",
        tokenizer=tokenizer_json,
        shard_size="2KB",
        workers=2,
        storage_options=options,
    )
    assert len(manifest.shards) > 2
    got = read_documents(url, options)
    assert [t.tolist() for _, t in got] == [[*reference(t), 0] for t in DOCS]


def test_a_tokenizer_saved_to_truncate_and_pad_stores_documents_whole(tmp_path, tokenizer_json, reference):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_length=5)
    tok.enable_padding(length=64, pad_id=1, pad_token="<bos>")
    saved = tmp_path / "model-tokenizer.json"
    tok.save(str(saved))
    dest = tmp_path / "ds"
    pack(_jsonl(tmp_path / "a.jsonl"), dest, format="tokens", tokenizer=saved, workers=1)
    _check(dest, DOCS, reference)
