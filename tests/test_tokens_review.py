"""Review fixes of the token read path: a shared read lays out no plan window before its
turn, sidecars come in turn, and a missing best-fit sidecar names its shard."""

from __future__ import annotations

import pathlib
import threading

import pytest

import shardstream
from shardstream.catalog import record_sequences
from shardstream.dataset.sequence_reads import DocumentTokens
from shardstream.errors import StorageError
from shardstream.folder import fit_sidecar_name
from shardstream.plan import epoch
from tests.test_tokens_reads import S, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("review") / "ds")
    write_corpus(url)
    return url


def test_the_first_sample_waits_for_no_more_plan_windows_than_the_reads_ahead(corpus, monkeypatch):
    laid = []
    plain = epoch._window_parts

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        laid.append(args[3])  # the window's number
        return plain(*args, **kwargs)

    monkeypatch.setattr(epoch, "_window_parts", counted)
    dataset = shardstream.StreamingDataset(corpus, seq_len=S, packing="best_fit", seed=1, shuffle_window=9)
    windows = len(list(dataset.make_plan(num_workers=1, consume=False).worker_windows(0, 0)))
    laid.clear()
    iterator = iter(dataset)
    next(iterator)
    del iterator
    assert windows > 8
    assert len(laid) <= 4  # the windows being read, not all those a shared read looks ahead at


class _Reader:
    """What ``DocumentTokens`` fetches through: each window's fetch runs ``steps[window]``
    (its sidecars), then takes its bytes."""

    prefetch, budget = 2, None

    def __init__(self) -> None:
        self.begun: list[int] = []
        self.steps: dict[int, threading.Event] = {}
        self.fails: set[int] = set()

    def fetch(self, window, take, tell):  # type: ignore[no-untyped-def]
        self.begun.append(window.number)
        step = self.steps.get(window.number)
        if step is not None:
            step.wait(10)
        if window.number in self.fails:
            raise StorageError("not found (read)", url=f"memory://w{window.number}")
        if take is not None:
            take(1)
        return window.number

    def close(self) -> None:
        pass


class _Window:
    shards = ()

    def __init__(self, number: int) -> None:
        self.number = number


def _numbered(count: int) -> tuple[DocumentTokens, _Reader, list[_Window]]:
    reader = _Reader()
    tokens = DocumentTokens(reader)  # type: ignore[arg-type]
    windows = [_Window(n) for n in range(count)]
    assert list(tokens._numbered(iter(windows))) == windows
    return tokens, reader, windows


def _started(tokens: DocumentTokens, window: _Window, take=lambda size: None) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=tokens.fetch, args=(window, take), daemon=True)
    thread.start()
    return thread


def _ends(thread: threading.Thread) -> bool:
    thread.join(10)
    return not thread.is_alive()


def test_a_window_reads_its_sidecars_once_the_window_before_has_its_own():
    tokens, reader, windows = _numbered(2)
    reader.steps[0] = threading.Event()
    first = _started(tokens, windows[0])
    second = _started(tokens, windows[1])
    second.join(0.2)
    assert reader.begun == [0]  # window 1 waits while window 0 reads its sidecars
    reader.steps[0].set()
    assert _ends(first)
    assert _ends(second)
    assert reader.begun == [0, 1]


def test_a_failing_fetch_lets_the_next_window_by():
    tokens, reader, windows = _numbered(2)
    reader.fails.add(0)
    with pytest.raises(StorageError):
        tokens.fetch(windows[0], lambda size: None)
    assert tokens.fetch(windows[1], lambda size: None) == 1


def test_a_fetch_asking_no_bytes_lets_the_next_window_by():
    tokens, _, windows = _numbered(2)
    assert tokens.fetch(windows[0]) == 0  # no read budget: no take
    assert _ends(_started(tokens, windows[1]))
    tokens.close()


def test_closing_wakes_a_window_waiting_its_turn():
    tokens, reader, windows = _numbered(2)
    waiting = _started(tokens, windows[1])  # window 0 is never fetched
    waiting.join(0.2)
    assert not reader.begun
    tokens.close()
    assert _ends(waiting)


@pytest.mark.parametrize("packing", ["best_fit", "pad"])
def test_a_missing_sample_index_names_its_shard_under_any_packing(tmp_path, packing):
    url = str(tmp_path / "ds")
    write_corpus(url)
    info = shardstream.StreamingDataset(url).manifest.shards[3]
    (pathlib.Path(url) / info.index).unlink()
    with pytest.raises(StorageError) as raised:
        list(shardstream.StreamingDataset(url, seq_len=S, packing=packing, seed=1))
    assert raised.value.shard == info.path
    assert raised.value.url is not None
    assert raised.value.url.endswith(info.index)


def test_a_missing_best_fit_sidecar_names_its_shard(tmp_path):
    url = str(tmp_path / "ds")
    write_corpus(url)
    record_sequences(url, S)
    info = shardstream.StreamingDataset(url).manifest.shards[3]
    (pathlib.Path(url) / fit_sidecar_name(info.path, S)).unlink()
    with pytest.raises(StorageError) as raised:
        list(shardstream.StreamingDataset(url, seq_len=S, packing="best_fit", seed=1))
    assert raised.value.shard == info.path
