"""Packed sequences read as their runs' tokens (NOTE [ Tokens without documents ]), a
best-fit shard read once across windows (NOTE [ A shard read once across windows ]):
every sequence a dataset yields equals the one built alone from its shard's own tokens,
whatever the windows, the shuffle, the storage, or the mixture around it."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import shardstream
import shardstream.storage.local as local_files
from shardstream.catalog import record_sequences
from shardstream.dataset import sequences
from shardstream.dataset.sequence_reads import CHAIN_WINDOWS, joined_runs, placed_runs, shared_shards
from shardstream.errors import FormatError
from shardstream.formats.tokens import TokensIndex
from shardstream.plan import Run, Window
from shardstream.tokens import Packing, build_sequences, sequence_layout

S = 32
FIELDS = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")


def write_corpus(url: str, *, storage_options: dict | None = None, seed: int = 0) -> None:
    """About 14,000 tokens in 7 shards: lognormal documents, some empty, some longer than S."""
    rng = np.random.default_rng(seed)
    with shardstream.ShardWriter(
        url, format="tokens", samples_per_shard=70, storage_options=storage_options
    ) as writer:
        for number in range(480):
            n = 0 if number % 37 == 5 else int(max(1, rng.lognormal(3.2, 0.9)))
            writer.write({"__key__": f"{number:06d}", "tokens": rng.integers(2, 900, n, dtype=np.uint16)})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("reads") / "ds")
    write_corpus(url)
    return url


def expected(dataset: shardstream.StreamingDataset, url: str, packing: str) -> list[dict[str, np.ndarray]]:
    """The sequences of ``dataset``'s plan (one worker), each built alone from its shard's tokens."""
    manifest = dataset.manifest
    infos = manifest.shards
    root = pathlib.Path(url)
    eos = manifest.tokens.eos_id if manifest.tokens is not None else None
    pad = 0 if eos is None else int(eos)
    bases = np.cumsum([info.samples for info in infos]) - [info.samples for info in infos]
    layouts, tokens = {}, {}
    out = []
    for shard, index in dataset.make_plan(num_workers=1, consume=False).worker_samples(0, 0):
        if shard not in layouts:
            info = infos[shard]
            ends = TokensIndex.from_bytes((root / info.index).read_bytes(), name=info.path).ends
            layouts[shard] = sequence_layout(Packing(S, packing), ends)
            tokens[shard] = np.fromfile(root / info.path, dtype=np.uint16)
        run = layouts[shard].run(index, index + 1)
        built = build_sequences(run, tokens[shard], 0, doc_base=int(bases[shard]), pad_id=pad)
        out.append({name: built[name][0] for name in FIELDS})
    return out


def same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for name in FIELDS:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
@pytest.mark.parametrize(("shuffle", "window"), [(True, None), (True, 9), (False, 9), (False, None)])
def test_every_sequence_is_the_one_built_alone_from_its_shard(corpus, packing, shuffle, window):
    dataset = shardstream.StreamingDataset(
        corpus, seq_len=S, packing=packing, shuffle=shuffle, seed=4, shuffle_window=window
    )
    same(list(dataset), expected(dataset, corpus, packing))


@pytest.fixture
def tokens_read(monkeypatch):
    """Bytes read from each local ``.tokens`` file, by path, as the test goes on."""
    read: dict[str, int] = {}
    plain = local_files.read_range

    def counted(path: str, start: int, length: int, **kwargs):  # type: ignore[no-untyped-def]
        if path.endswith(".tokens"):
            read[path] = read.get(path, 0) + length
        return plain(path, start, length, **kwargs)

    monkeypatch.setattr(local_files, "read_range", counted)
    return read


def test_a_best_fit_shard_cut_between_two_windows_is_read_once(corpus, tokens_read):
    read = tokens_read
    dataset = shardstream.StreamingDataset(corpus, seq_len=S, packing="best_fit", seed=1)
    windows = list(dataset.make_plan(num_workers=1, consume=False).worker_windows(0, 0))
    cut = {shard for one in windows for shard in one.shards if sum(shard in w.shards for w in windows) > 1}
    assert len(windows) == 2
    assert cut  # shards whose sequences the two windows share
    same(list(dataset), expected(dataset, corpus, "best_fit"))
    sizes = {str(pathlib.Path(corpus) / info.path): info.bytes for info in dataset.manifest.shards}
    assert read
    assert all(read[path] <= sizes[path] for path in read)


def test_windows_lend_a_shard_every_other_window_and_never_one_they_borrowed():
    windows = [
        Window([Run(s, 0, 1) for s in shards], np.arange(len(shards)))
        for shards in ([0, 1], [1], [1, 2], [2])
    ]
    shared = [one for _, one in shared_shards(iter(windows), True)]
    assert [sorted(one.lends) for one in shared] == [[1], [], [2], []]
    assert [sorted(one.borrows) for one in shared] == [[], [1], [], [2]]
    assert [sorted(one.keeps) for one in shared] == [[1], [], [2], []]
    assert shared[1].runs == shared[0].runs == (Run(1, 0, 1), Run(1, 0, 1))
    alone = [one for _, one in shared_shards(iter(windows), False)]
    assert all(not one.lends and not one.borrows for one in alone)
    unshuffled = [one for _, one in shared_shards(iter(windows), lambda window: window is not windows[1])]
    assert [sorted(one.lends) for one in unshuffled] == [[], [], [2], []]


def test_a_chained_shard_is_read_once_and_lent_along_every_window_that_holds_it():
    windows = [
        Window([Run(s, w, w + 1) for s in shards], np.arange(len(shards)))
        for w, shards in enumerate(([0, 1], [1, 2], [1, 2], [1], [0, 2]))
    ]
    shared = [one for _, one in shared_shards(iter(windows), True, {1}.__contains__)]
    assert [sorted(one.lends) for one in shared] == [[1], [2], [], [], []]
    assert [sorted(one.borrows) for one in shared] == [[], [1], [1, 2], [1], []]
    assert [sorted(one.keeps) for one in shared] == [[1], [1, 2], [1], [], []]
    chain = (Run(1, 0, 1), Run(1, 1, 2), Run(1, 2, 3), Run(1, 3, 4))
    assert all(tuple(one.of(frozenset({1}))) == chain for one in shared[:4])


def test_sequence_runs_are_placed_in_the_document_runs_that_hold_them():
    ends = np.cumsum(np.full(20, 10, dtype=np.int64))
    layout = sequence_layout(Packing(16, "concat"), ends)
    runs = [(3, layout.run(0, 2)), (3, layout.run(8, 10)), (3, layout.run(2, 3))]
    joined = joined_runs(runs)
    assert joined == [Run(3, 0, 5), Run(3, 12, 16)]
    assert [at for _, at in placed_runs(runs, joined)] == [0, 1, 0]


def test_a_token_mixture_reads_the_same_sequences(corpus):
    alone = shardstream.StreamingDataset(corpus, seq_len=S, packing="best_fit", seed=2)
    mixed = shardstream.StreamingDataset(
        [shardstream.Stream(corpus, weight=1)], seq_len=S, packing="best_fit", seed=2
    )
    got = sorted(tuple(sample["input_ids"].tolist()) for sample in mixed)
    assert got == sorted(tuple(sample["input_ids"].tolist()) for sample in alone)


@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_a_mixture_of_two_streams_cuts_the_same_tokens_as_its_decoded_documents(
    corpus, tmp_path, packing, monkeypatch
):
    other = str(tmp_path / "other")
    write_corpus(other, seed=1)

    def mixed() -> list[dict]:
        streams = [shardstream.Stream(corpus, weight=2), shardstream.Stream(other, weight=1)]
        return list(shardstream.StreamingDataset(streams, seq_len=S, packing=packing, seed=6))

    cut = mixed()
    monkeypatch.setattr(sequences, "MixtureReader", type("NotMixtures", (), {}))  # its documents decoded
    decoded = mixed()
    same(cut, decoded)
    assert [a["__stream__"] for a in cut] == [b["__stream__"] for b in decoded]
    assert {a["__stream__"] for a in cut} == {0, 1}


@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_sequences_from_s3_are_those_of_the_same_shards_on_disk(s3, tmp_path, packing):
    base, options = s3
    write_corpus(f"{base}/ds", storage_options=options)
    write_corpus(str(tmp_path / "ds"))
    far = shardstream.StreamingDataset(
        f"{base}/ds", seq_len=S, packing=packing, seed=3, storage_options=options
    )
    near = shardstream.StreamingDataset(str(tmp_path / "ds"), seq_len=S, packing=packing, seed=3)
    same(list(far), list(near))


@pytest.mark.parametrize("packing", ["concat", "pad", "best_fit"])
def test_unshuffled_windows_from_s3_come_in_pieces_of_the_budget(s3, tmp_path, packing, monkeypatch):
    base, options = s3
    write_corpus(f"{base}/ds", storage_options=options)
    write_corpus(str(tmp_path / "ds"))
    pieces = []
    plain = sequences.in_pieces

    def counted(windows, shards, limit, **given):  # type: ignore[no-untyped-def]
        for piece in plain(windows, shards, limit, **given):
            pieces.append(piece)
            yield piece

    monkeypatch.setattr(sequences, "in_pieces", counted)
    far = shardstream.StreamingDataset(
        f"{base}/ds", seq_len=S, packing=packing, shuffle=False, read_budget=8000, storage_options=options
    )
    near = shardstream.StreamingDataset(str(tmp_path / "ds"), seq_len=S, packing=packing, shuffle=False)
    same(list(far), list(near))
    windows = len(list(near.make_plan(num_workers=1, consume=False).worker_windows(0, 0)))
    assert len(pieces) > windows if packing != "best_fit" else not pieces  # best-fit bins lie apart


@pytest.mark.parametrize(("packing", "shuffle"), [("concat", False), ("best_fit", True)])
def test_resumed_mid_epoch_from_s3_the_rest_is_the_same(s3, packing, shuffle):
    base, options = s3
    write_corpus(f"{base}/ds", storage_options=options)
    made = dict(
        seq_len=S, packing=packing, shuffle=shuffle, seed=5, read_budget=8000, storage_options=options
    )
    whole = list(shardstream.StreamingDataset(f"{base}/ds", **made))
    for taken in (1, 100, 300):  # in the first window (or piece), and later
        dataset = shardstream.StreamingDataset(f"{base}/ds", **made)
        iterator = iter(dataset)
        head = [next(iterator) for _ in range(taken)]
        state = dataset.state_dict()
        del iterator
        resumed = shardstream.StreamingDataset(f"{base}/ds", **made)
        resumed.load_state_dict(state)
        same(head + list(resumed), whole)


def test_recorded_best_fit_sidecars_read_beside_the_indexes_give_the_same_sequences(
    s3, tmp_path, monkeypatch
):
    base, options = s3
    write_corpus(f"{base}/ds", storage_options=options)
    record_sequences(f"{base}/ds", S, storage_options=options)
    write_corpus(str(tmp_path / "ds"))
    early = []
    plain = sequences.SequenceReader.read_fits

    def counted(self, shards):  # type: ignore[no-untyped-def]
        early.append(tuple(shards))
        return plain(self, shards)

    monkeypatch.setattr(sequences.SequenceReader, "read_fits", counted)
    made = dict(seq_len=S, packing="best_fit", seed=7)
    far = shardstream.StreamingDataset(f"{base}/ds", storage_options=options, **made)
    near = shardstream.StreamingDataset(str(tmp_path / "ds"), **made)
    same(list(far), list(near))
    assert early  # each window's fetch read them beside its own
    assert far.manifest.sequences  # counted from the recorded sidecars


def test_a_corrupt_token_shard_fails_its_sequences(tmp_path):
    url = str(tmp_path / "ds")
    write_corpus(url)
    info = shardstream.StreamingDataset(url).manifest.shards[2]
    path = pathlib.Path(url) / info.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    for on_error in ("raise", "skip"):
        dataset = shardstream.StreamingDataset(url, seq_len=S, packing="best_fit", on_error=on_error)
        with pytest.raises(FormatError):
            list(dataset)


def test_a_small_best_fit_shard_is_read_once_across_all_the_windows_that_hold_it(corpus, tokens_read):
    read = tokens_read
    dataset = shardstream.StreamingDataset(corpus, seq_len=S, packing="best_fit", seed=1, shuffle_window=16)
    windows = list(dataset.make_plan(num_workers=1, consume=False).worker_windows(0, 0))
    held = [sum(shard in w.shards for w in windows) for shard in range(7)]
    assert 2 < max(held) <= CHAIN_WINDOWS  # one read of each shard, shared along its windows
    same(list(dataset), expected(dataset, corpus, "best_fit"))
    sizes = {str(pathlib.Path(corpus) / info.path): info.bytes for info in dataset.manifest.shards}
    assert read
    assert all(read[path] <= sizes[path] for path in read)
