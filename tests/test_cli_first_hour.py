"""The command line as a new user meets it: counts in words ("1 shard"), ``--json``
errors as JSON on stdout, a bar with percent and time left, warnings on their own line,
a rerun that says what it reused, and Ctrl-C that says rerunning resumes."""

from __future__ import annotations

import io
import json
import logging

import pytest

from shardstream import cli
from shardstream.cli import main
from shardstream.pack import pack
from shardstream.progress import ProgressBar, plural


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"txt": f"text {i}"}) + "\n" for i in range(6)))
    return path


def test_counts_are_said_in_words():
    assert plural(1, "shard") == "1 shard"
    assert plural(0, "shard") == "0 shards"
    assert plural(2_000, "sample") == "2,000 samples"
    assert plural(1, "shard has", "shards have") == "1 shard has"


def test_one_shard_is_one_shard(tmp_path, corpus, capsys):
    dest = tmp_path / "ds"
    assert main(["pack", str(corpus), str(dest)]) == 0
    out = capsys.readouterr().out
    assert "into 1 shard at" in out
    assert "1 shards" not in out
    assert main(["verify", str(dest)]) == 0
    assert "verify: 1 shard, 6 samples checked: OK" in capsys.readouterr().out
    assert main(["index", str(dest)]) == 0
    assert "index: 1 tar shard, 6 samples" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_json_errors_are_json_on_stdout_with_a_nonzero_exit(tmp_path, command, capsys):
    missing = str(tmp_path / "typo")
    assert main([command, missing, "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["type"] == "NotADatasetError"
    assert "nothing is there" in record["error"]
    assert record["url"].startswith(missing)


def test_the_bar_shows_percent_and_time_left_where_the_size_is_known():
    stream = io.StringIO()
    progress = ProgressBar("pack", total=200, stream=stream, enabled=True)
    progress.update(100, 1_000_000)
    progress.update(100, 1_000_000)
    drawn = stream.getvalue()
    progress.close()
    assert "100%" in drawn
    assert "200/200 samples" in drawn
    assert "<00:00]" in drawn  # the time left, after the time spent
    unknown = io.StringIO()
    progress = ProgressBar("pack", stream=unknown, enabled=True)
    progress.update(5, 10)
    progress.close()
    assert "%" not in unknown.getvalue()
    assert "5 samples" in unknown.getvalue() or "0 samples" in unknown.getvalue()


def test_a_warning_is_a_line_of_its_own_above_the_bar():
    stream = io.StringIO()
    progress = ProgressBar("pack", total=10, stream=stream, enabled=True)
    progress.update(5, 100)
    with progress.messages():
        logging.getLogger("shardstream.pack").warning("pack: a warning")
    progress.close()
    lines = stream.getvalue().split("\n")
    assert any(line.rstrip().endswith("pack: a warning") for line in lines)
    (warned,) = [line for line in lines if "a warning" in line]
    assert "%|" not in warned.split("\r")[-1]  # the bar was cleared from its line first


class Killed(Exception):
    pass


class DiesAfter(ProgressBar):
    """A pack's progress that stops the pack after ``samples`` samples, as Ctrl-C would."""

    def __init__(self, samples: int) -> None:
        super().__init__("pack", enabled=False)
        self.limit = samples

    def update(self, samples: int, nbytes: int) -> None:
        super().update(samples, nbytes)
        if self.samples >= self.limit:
            raise Killed


def test_a_rerun_says_what_it_reused(tmp_path, corpus):
    dest = tmp_path / "ds"
    with pytest.raises(Killed):
        pack(corpus, dest, samples_per_shard=2, workers=1, progress=DiesAfter(4))
    assert not (dest / ".shardstream" / "manifest.json").exists()
    progress = ProgressBar("pack", enabled=False)
    pack(corpus, dest, samples_per_shard=2, workers=1, progress=progress)
    assert progress.shards == 3
    assert progress.shards_reused >= 1
    assert f"resumed: {progress.shards_reused} of 3 shards kept from the run before" in progress.summary()
    fresh = ProgressBar("pack", enabled=False)
    pack(corpus, tmp_path / "other", samples_per_shard=2, workers=1, progress=fresh)
    assert "resumed" not in fresh.summary()


def test_ctrl_c_says_that_rerunning_resumes(tmp_path, corpus, monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["pack"].set_defaults(run=interrupted)
    assert main(["pack", str(corpus), str(tmp_path / "ds")]) == 130
    err = capsys.readouterr().err
    assert "interrupted; run the same command again to resume" in err


def test_a_json_lines_file_gives_the_bar_its_total(tmp_path, monkeypatch):
    from shardstream.pack.sources import jsonl, open_source

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"txt": "x" * 10}) + "\n" for _ in range(1000)))
    assert open_source(str(path)).estimate() == 1000
    monkeypatch.setattr(jsonl, "_COUNTED", 4096)  # a file larger than what is counted
    assert 900 <= open_source(str(path)).estimate() <= 1100
    (tmp_path / "c.jsonl.gz").write_bytes(b"")
    assert open_source(str(tmp_path / "c.jsonl.gz")).estimate() is None  # compressed: unknown
