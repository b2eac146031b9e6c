"""Benchmark token streams (docs/tokens.md): each section prints its rates and its ratio
against the baseline it names.

    python tools/bench_tokens.py                      # every section
    python tools/bench_tokens.py --only bestfit       # best-fit bins against a Python best-fit
    python tools/bench_tokens.py --only build         # building packed sequences against numpy chunking
    python tools/bench_tokens.py --only bestfit --tokens 10000000   # a quick run
    python tools/bench_tokens.py --only start        # plan start at 15T tokens against Megatron-like indexes
    python tools/bench_tokens.py --only deliver      # packed sequences from disk against a bare memmap reader
    python tools/bench_tokens.py --only deliver-wan  # the same from S3 behind the WAN proxy, against the wire

Sections register themselves in SECTIONS (name -> function taking the parsed arguments);
each adds its own options in its ``_options_*`` function.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {}
OPTIONS: list[Callable[[argparse.ArgumentParser], None]] = []


def section(
    name: str,
) -> Callable[[Callable[[argparse.Namespace], None]], Callable[[argparse.Namespace], None]]:
    def register(func: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], None]:
        SECTIONS[name] = func
        return func

    return register


# -- sections: each between its own markers, so that edits to one never touch another --

# -- section tokenize (begin) --
# Tokenizing in pack against the tokenizers batch encoder alone, on the same text and
# cores: the pack runs as the CLI does (a fresh process, so the encoder's threads are its
# own), for each --workers count; the encoder alone runs so too, on the texts in pack's
# batches. Each side is timed inside its process, its start and imports left out.


def _options_tokenize(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tokenize")
    group.add_argument("--text-mb", type=float, default=32.0, help="MB of text to tokenize (default: 32)")
    group.add_argument(
        "--tokenizer", help="a tokenizer.json (default: a byte-level BPE of --vocab ids trained here)"
    )
    group.add_argument(
        "--vocab", type=int, default=32000, help="vocabulary of the trained BPE (default: 32000)"
    )
    group.add_argument(
        "--workers", type=int, action="append", help="pack --workers counts to time (default: 1 and 2)"
    )
    group.add_argument("--repeat", type=int, default=2, help="runs of each, the best kept (default: 2)")
    group.add_argument(
        "--encoder-threads",
        type=int,
        help="RAYON_NUM_THREADS for the encoder alone and every pack process (default: the encoder's own, "
        "and cores/workers in a pack's workers); 1 shows how packs scale with --workers alone",
    )


OPTIONS.append(_options_tokenize)


def _corpus_texts(megabytes: float, seed: int = 0) -> list[str]:
    """English-like documents (Zipf words, lognormal lengths) of about ``megabytes`` MB."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1.0 / np.arange(1, 27)
    words = [
        "".join(rng.choice(letters, int(n), p=weights / weights.sum())) for n in rng.integers(1, 11, 20000)
    ]
    ranks = 1.0 / np.arange(1, len(words) + 1)
    ranks /= ranks.sum()
    texts, size = [], 0
    while size < megabytes * 1e6:
        count = int(min(rng.lognormal(5.5, 1.0), 20000))  # words: a mean of ~400, some long
        text = " ".join(words[i] for i in rng.choice(len(words), count, p=ranks))
        texts.append(text)
        size += len(text) + 1
    return texts


def _bench_tokenizer(args: argparse.Namespace, texts: list[str], folder: Path) -> Path:
    if args.tokenizer:
        return Path(args.tokenizer)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts[: max(1, len(texts) // 8)], trainer=trainer)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


_ENCODER_CHILD = """
import json, sys, time
from tokenizers import Tokenizer
source, tokenizer, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(source, encoding="utf-8") as f:
    texts = [json.loads(line)["text"] for line in f]
tok = Tokenizer.from_file(tokenizer)
encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
start, cpu = time.perf_counter(), time.process_time()
tokens = sum(len(e.ids) for i in range(0, len(texts), batch) for e in encode(texts[i : i + batch]))
print(time.perf_counter() - start, time.process_time() - cpu, tokens)
"""


def _child_env(threads: int | None) -> dict[str, str]:
    import os

    env = dict(os.environ)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    return env


def _time_encoder(source: Path, tokenizer: Path, threads: int | None = None) -> tuple[float, float, int]:
    """Wall and CPU seconds of the batch encoder alone over the texts of ``source``, in
    batches as pack makes them, in a fresh process as the pack runs; and the tokens made."""
    import subprocess

    from shardstream.pack.tokenize import _BATCH

    argv = [str(source), str(tokenizer), str(_BATCH)]
    done = subprocess.run(
        [sys.executable, "-c", _ENCODER_CHILD, *argv],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_child_env(threads),
    )
    seconds, cpu, tokens = done.stdout.split()[-3:]
    return float(seconds), float(cpu), int(tokens)


_PACK_CHILD = """
import resource, sys, time
from shardstream.pack import pack
source, dest, tokenizer, workers, per_shard = sys.argv[1:]
def cpu():
    done = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pack's workers, once they are gone
    return time.process_time() + done.ru_utime + done.ru_stime
start, used = time.perf_counter(), cpu()
pack(source, dest, format="tokens", tokenizer=tokenizer, workers=int(workers), samples_per_shard=int(per_shard))
print(time.perf_counter() - start, cpu() - used)
"""


def _time_pack(
    source: Path, tokenizer: Path, dest: Path, workers: int, per_shard: int, threads: int | None = None
) -> tuple[float, float]:
    """Wall and CPU seconds (its workers' too) of one ``pack(..., tokenizer=)`` in a fresh
    process (its start and imports left out: a fixed cost, not the pack's rate)."""
    import shutil
    import subprocess

    shutil.rmtree(dest, ignore_errors=True)
    argv = [str(source), str(dest), str(tokenizer), str(workers), str(per_shard)]
    done = subprocess.run(
        [sys.executable, "-c", _PACK_CHILD, *argv],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_child_env(threads),
    )
    seconds, cpu = done.stdout.split()[-2:]
    return float(seconds), float(cpu)


@section("tokenize")
def bench_tokenize(args: argparse.Namespace) -> None:
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as tmp:
        folder = Path(tmp)
        texts = _corpus_texts(args.text_mb)
        megabytes = sum(len(t.encode()) + 1 for t in texts) / 1e6
        tokenizer = _bench_tokenizer(args, texts, folder)
        source = folder / "corpus.jsonl"
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(
            f"{len(texts):,} documents, {megabytes:.1f} MB of text, {cores} cores, tokenizer {tokenizer.name}"
        )
        counts = args.workers or [1, 2]
        per_shard = max(1, len(texts) // 16)  # 16 shards whatever the workers
        best = dict.fromkeys(["encoder", *counts], float("inf"))
        cpus = dict.fromkeys(["encoder", *counts], float("inf"))
        tokens = 0
        for _ in range(args.repeat):  # interleaved: the machine's other load falls on all alike
            seconds, cpu, tokens = _time_encoder(source, tokenizer, args.encoder_threads)
            best["encoder"], cpus["encoder"] = min(best["encoder"], seconds), min(cpus["encoder"], cpu)
            for workers in counts:
                took, cpu = _time_pack(
                    source, tokenizer, folder / "ds", workers, per_shard, args.encoder_threads
                )
                best[workers], cpus[workers] = min(best[workers], took), min(cpus[workers], cpu)
        base = megabytes / best["encoder"]
        print(
            f"tokenizers batch encoder alone  {base:8.2f} MB/s  {tokens / best['encoder'] / 1e6:6.2f} M tokens/s"
        )
        rates = {}
        for workers in counts:
            took = best[workers]
            rates[workers] = megabytes / took
            print(
                f"pack --workers {workers:<2}              {rates[workers]:8.2f} MB/s  "
                f"{tokens / took / 1e6:6.2f} M tokens/s  {rates[workers] / base:.2f}x of the encoder alone"
            )
        first = min(rates)
        for workers in sorted(rates)[1:]:
            print(f"--workers {workers} against --workers {first}: {rates[workers] / rates[first]:.2f}x")
        # CPU time is what other load on a shared machine disturbs least
        print(f"CPU seconds per MB: encoder alone {cpus['encoder'] / megabytes:.3f}", end="")
        for workers in counts:
            ratio = cpus["encoder"] / cpus[workers]
            print(
                f", pack --workers {workers} {cpus[workers] / megabytes:.3f} ({ratio:.2f}x the text per CPU second)",
                end="",
            )
        print()
        ratios = {f"pack --workers {w} / encoder alone": rates[w] / base for w in counts}
        ratios.update({f"pack --workers {w} / encoder alone, CPU": cpus["encoder"] / cpus[w] for w in counts})
        ratios.update(
            {f"--workers {w} / --workers {first}": rates[w] / rates[first] for w in sorted(rates)[1:]}
        )
        figures = {"encoder alone": base, **{f"pack --workers {w}": rates[w] for w in counts}}
        # one encoder thread a process shows how packs scale with --workers alone: its own claim
        record(
            args, "tokens-pack-one-thread" if args.encoder_threads == 1 else "tokens-pack", figures, ratios
        )


# -- section tokenize (end) --

# -- sections bestfit, build (begin) --
# Best-fit bins and sequence building (shardstream/tokens) on synthetic shards: documents of
# lognormal lengths (mean --mean-doc tokens, log-sd --sigma), cut at --seq-len as the packing
# does. Rates are per core: tokens over the process's CPU seconds (one thread), the best of
# --rounds, so other load on the machine counts less than in wall time. Building writes
# fresh arrays, so its rate counts the page faults of new memory as a loader's does (glibc
# returns freed memory to the system: MALLOC_TRIM_THRESHOLD_ changes that, and the rate).


def _options_packing(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("bestfit, build")
    group.add_argument("--tokens", type=int, default=100_000_000, help="tokens per shard (default: 100M)")
    group.add_argument("--shards", type=int, default=1, help="shards (seeds) for bestfit (default: 1)")
    group.add_argument("--seq-len", type=int, default=4096, help="sequence length S (default: 4096)")
    group.add_argument("--mean-doc", type=float, default=800.0, help="mean document length (default: 800)")
    group.add_argument("--sigma", type=float, default=1.0, help="log-sd of document lengths (default: 1.0)")
    group.add_argument("--rounds", type=int, default=3, help="timed rounds, the best kept (default: 3)")
    group.add_argument("--no-reference", action="store_true", help="bestfit: skip the Python best-fit")
    group.add_argument("--build-tokens", type=int, default=16_000_000, help="build: tokens (default: 16M)")
    group.add_argument("--run-seqs", type=int, default=64, help="build: sequences per run (default: 64)")


OPTIONS.append(_options_packing)


def _document_ends(tokens: int, mean: float, sigma: float, seed: int):  # type: ignore[no-untyped-def]
    import numpy as np

    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2
    lengths = np.maximum(1, rng.lognormal(mu, sigma, int(2 * tokens / mean) + 16).astype(np.int64))
    ends = np.cumsum(lengths)
    return ends[: int(np.searchsorted(ends, tokens)) + 1]


def _cpu_best(func, rounds: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """(least CPU seconds of ``rounds`` calls, the last result)."""
    import time

    best, result = float("inf"), None
    for _ in range(max(1, rounds)):
        start = time.process_time()
        result = func()
        best = min(best, time.process_time() - start)
    return max(best, 1e-9), result


def reference_best_fit(sizes: list[int], seq_len: int) -> int:
    """Bins of a per-document Python best-fit-decreasing, as OLMo-core's packer: pieces sorted
    longest first, each into the open bin with the least room that holds it (bisect over
    the open bins kept sorted by room), else a new bin."""
    from bisect import bisect_left, insort

    rooms: list[tuple[int, int]] = []  # (room, bin), sorted
    bins: list[list[int]] = []
    for piece, size in sorted(enumerate(sizes), key=lambda p: -p[1]):
        i = bisect_left(rooms, (size, -1))
        if i == len(rooms):
            bins.append([piece])
            insort(rooms, (seq_len - size, len(bins) - 1))
        else:
            room, b = rooms.pop(i)
            bins[b].append(piece)
            insort(rooms, (room - size, b))
    return len(bins)


@section("bestfit")
def bench_bestfit(args: argparse.Namespace) -> None:
    from shardstream.tokens import best_fit
    from shardstream.tokens.pieces import split_documents

    size = args.seq_len
    print(
        f"{args.shards} shard(s) of {args.tokens:,} tokens, documents lognormal (mean {args.mean_doc:g}, "
        f"sigma {args.sigma:g}), S={size}"
    )
    totals = {"tokens": 0, "ours_s": 0.0, "ours_pad": 0, "ref_s": 0.0, "ref_pad": 0, "least_pad": 0}
    for seed in range(args.shards):
        ends = _document_ends(args.tokens, args.mean_doc, args.sigma, seed)
        total = int(ends[-1])
        seconds, fit = _cpu_best(lambda ends=ends: best_fit(ends, size), args.rounds)
        totals["tokens"] += total
        totals["ours_s"] += seconds
        totals["ours_pad"] += fit.count * size - total  # type: ignore[attr-defined]
        totals["least_pad"] += -total % size
        if not args.no_reference:
            _, lo, hi = split_documents(ends, size)
            sizes = (hi - lo).tolist()
            ref_seconds, bins = _cpu_best(lambda sizes=sizes: reference_best_fit(sizes, size), 1)
            totals["ref_s"] += ref_seconds
            totals["ref_pad"] += bins * size - total  # type: ignore[operator]
    tokens = totals["tokens"]
    ours = tokens / totals["ours_s"]
    print(
        f"best_fit (blocks)            {ours / 1e6:9.1f} M tokens/s per core   "
        f"padding {100 * totals['ours_pad'] / tokens:.4f}%"
    )
    if not args.no_reference:
        ref = tokens / totals["ref_s"]
        print(
            f"Python best-fit (whole shard) {ref / 1e6:8.1f} M tokens/s per core   "
            f"padding {100 * totals['ref_pad'] / tokens:.4f}%"
        )
        print(f"best_fit against the Python best-fit: {ours / ref:.1f}x the rate")
        padding = {"best_fit padding %": 100 * totals["ours_pad"] / tokens}
        record(
            args,
            "tokens-bestfit",
            {"best_fit": ours / 1e6, "Python best-fit": ref / 1e6, **padding},
            {"best_fit / Python best-fit": ours / ref},
        )
    print(f"the least padding any packing has (whole sequences): {100 * totals['least_pad'] / tokens:.4f}%")


def _bare_chunks(tokens, size: int, runs: list[tuple[int, int]]) -> int:  # type: ignore[no-untyped-def]
    """A bare numpy concat-and-chunk reader: input_ids and next-token labels, int64 (the
    last _HELD runs' arrays kept, as a loader's queue holds its batches)."""
    made, held = 0, []
    for start, stop in runs:
        window = tokens[start * size : stop * size + 1].astype("int64")
        n = stop - start
        batch = {"input_ids": window[: n * size].reshape(n, size), "labels": window[1:].copy()}
        held = [*held[1 - _HELD :], batch]
        made += batch["input_ids"].size
    return made


_HELD = 2


@section("build")
def bench_build(args: argparse.Namespace) -> None:
    import numpy as np

    from shardstream.tokens import Packing, build_sequences, sequence_layout

    size, per_run = args.seq_len, args.run_seqs
    ends = _document_ends(args.build_tokens, args.mean_doc, args.sigma, 0)
    tokens = np.random.default_rng(0).integers(0, 50_000, int(ends[-1]) + 1, dtype=np.uint16)
    print(f"{int(ends[-1]):,} tokens (uint16), S={size}, runs of {per_run} sequences, arrays with masks")
    chunks = [(a, min(a + per_run, int(ends[-1]) // size)) for a in range(0, int(ends[-1]) // size, per_run)]
    bare_s, made = _cpu_best(lambda: _bare_chunks(tokens, size, chunks), args.rounds)
    bare = made / bare_s  # type: ignore[operator]
    print(f"bare numpy concat-and-chunk   {bare / 1e6:9.1f} M tokens/s per core")
    for packing in (Packing(size, "concat"), Packing(size, "best_fit"), Packing(size, "pad")):
        layout = sequence_layout(packing, ends)
        starts = range(0, layout.count, per_run)

        def build(layout=layout, starts=starts) -> int:  # type: ignore[no-untyped-def]
            made, held = 0, []
            for start in starts:  # each run laid out (its pieces found) and built
                run = layout.run(start, min(start + per_run, layout.count))
                t0, t1 = run.tokens
                batch = build_sequences(run, tokens[t0:t1], t0)
                held = [*held[1 - _HELD :], batch]
                made += batch["input_ids"].size
            return made

        seconds, made = _cpu_best(build, args.rounds)
        rate = made / seconds  # type: ignore[operator]
        print(
            f"build {packing.mode:<9}             {rate / 1e6:9.1f} M tokens/s per core   "
            f"{rate / bare:.2f}x of bare chunking"
        )


# -- sections bestfit, build (end) --


# -- sections start, deliver (begin) --
# start: the plan of a synthetic 15T-token manifest (100,000 shards, S=4096) for rank 5 of
# 1,024 in the global order, to its first window's runs, in a fresh process (the manifest
# read and parsed included, nothing else read), against Megatron-LM's way: document,
# sample and shuffle indexes built over every document and sequence (its index code
# redone in numpy here, run on a 1/SCALE slice and scaled up linearly, as its cost is).
# deliver: packed sequences with their masks from a local token dataset in one process (a
# DataLoader worker's work; best_fit's bins recorded beside the shards, as pack --seq-len
# does) against a bare numpy memmap concat-and-chunk reader of the same shards: per
# sequence one int64 copy of S + 1 tokens, input_ids and labels two views of it (labels
# not masked at document ends; no position_ids, document_ids, cu_seqlens): the limit.
# Beside it, for scale, the same reader making all five arrays a sequence at a time
# (``_bare_masked``), what a plain numpy reader with masks costs. And shardstream reading
# the shards mapped (``local_reads="map"``), as the bare reader does, where the default
# copies each read (a shard truncated in place then fails a read, not the process): the
# same bytes read the same way on both sides, each read still checked against its CRCs.


def _options_tokens_start(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("start and deliver")
    group.add_argument("--start-shards", type=int, default=100_000, help="shards of the synthetic manifest")
    group.add_argument("--start-tokens", type=float, default=15e12, help="tokens of the synthetic manifest")
    group.add_argument(
        "--megatron-scale", type=int, default=2000, help="the Megatron-like build runs 1/N of it"
    )
    group.add_argument("--deliver-tokens", type=float, default=60e6, help="tokens of the delivery dataset")
    group.add_argument("--deliver-seq-len", type=int, default=4096)
    group.add_argument(
        "--deliver-rounds", type=int, default=3, help="paired rounds of the local delivery (default: 3)"
    )


OPTIONS.append(_options_tokens_start)

_START_CHILD = """
import json, resource, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from shardstream.dataset import StreamingDataset  # torch and the package imported before the clock
rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096
base = rss()
t = time.perf_counter()
ds = StreamingDataset({url!r}, seq_len=4096, order='global', global_batch_size=1024,
                                  num_replicas=1024, rank=5)
plan = ds.make_plan(num_workers=8, consume=False)
window = next(iter(plan.worker_windows(5, 3)))
runs = window.runs
seconds = time.perf_counter() - t
print(json.dumps({{'seconds': seconds, 'rss': rss() - base, 'sequences': int(plan.samples_per_rank()) * 1024,
                  'runs': len(runs)}}))
"""


def _synthetic_manifest(folder: Path, shards: int, tokens: float) -> None:
    import json

    import numpy as np

    from shardstream.manifest import MANIFEST_NAME

    per = np.random.default_rng(0).normal(tokens / shards, tokens / shards / 20, shards).astype(np.int64)
    entries = [
        {
            "path": f"shard-{i:06d}.tokens",
            "samples": int(n // 800),
            "bytes": int(n) * 2,
            "sha256": f"{i:064x}",
            "index": f".shardstream/shard-{i:06d}.tokens.idx",
            "index_bytes": 0,
            "tokens": int(n),
        }
        for i, n in enumerate(per)
    ]
    manifest = {
        "version": 1,
        "format": "tokens",
        "shards": entries,
        "fields": ["tokens"],
        "writer": "bench_tokens",
        "tokens": {"dtype": "uint16", "vocab_size": 50000, "eos_id": 0, "bos_id": None, "tokenizer": None},
        "num_shards": shards,
        "num_samples": sum(e["samples"] for e in entries),
        "num_bytes": sum(e["bytes"] for e in entries),
        "num_tokens": int(per.sum()),
    }
    path = folder / MANIFEST_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


def _megatron_like(tokens: int, seq_len: int) -> tuple[float, int]:
    """Megatron-LM's GPTDataset indexes over ``tokens`` tokens of ~800-token documents, in
    numpy: the shuffled document index, the sample index (where each sequence starts) and
    the shuffled sample index; (seconds, bytes of the indexes)."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    sizes = np.maximum(1, rng.lognormal(6.4, 0.9, tokens // 800)).astype(np.int32)
    doc_idx = rng.permutation(len(sizes)).astype(np.int32)
    ends = np.cumsum(sizes[doc_idx], dtype=np.int64)
    samples = int(ends[-1]) // seq_len
    cuts = np.arange(samples + 1, dtype=np.int64) * seq_len
    where = np.searchsorted(ends, cuts, side="right")
    offset = cuts - np.concatenate([[0], ends])[where]
    sample_idx = np.stack([where.astype(np.int32), offset.astype(np.int32)], axis=1)
    shuffle_idx = rng.permutation(samples).astype(np.int64)
    seconds = time.perf_counter() - start
    return seconds, doc_idx.nbytes + sample_idx.nbytes + shuffle_idx.nbytes + sizes.nbytes


@section("start")
def bench_start(args: argparse.Namespace) -> None:
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        _synthetic_manifest(Path(folder), args.start_shards, args.start_tokens)
        child = _START_CHILD.format(root=str(ROOT), url=folder)
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    scale = args.megatron_scale
    seconds, nbytes = _megatron_like(int(args.start_tokens / scale), 4096)
    theirs_s, theirs_b = seconds * scale, nbytes * scale
    print(
        f"{args.start_tokens / 1e12:.0f}T tokens, {args.start_shards:,} shards, S=4096: "
        f"{ours['sequences']:,} sequences; rank 5 of 1024, worker 3 of 8, global order"
    )
    print(
        f"shardstream: plan to the first window {ours['seconds']:.3f} s, memory +{ours['rss'] / 2**20:.0f} MB"
    )
    print(
        f"Megatron-like indexes (1/{scale} built, scaled): {theirs_s:,.0f} s, {theirs_b / 2**30:,.1f} GiB "
        f"-> shardstream starts {theirs_s / ours['seconds']:,.0f}x sooner with "
        f"{theirs_b / max(ours['rss'], 1):,.0f}x less memory"
    )
    figures = {"shardstream s": ours["seconds"], "shardstream MB": ours["rss"] / 2**20}
    figures.update({"Megatron-like s": theirs_s, "Megatron-like MB": theirs_b / 2**20})
    record(args, "tokens-start", figures, {"start, Megatron-like / shardstream": theirs_s / ours["seconds"]})


def _bare_masked(paths: list[str], ends: list, size: int) -> int:  # type: ignore[type-arg]
    """The bare memmap reader making all five arrays of each sequence, one at a time: labels
    -100 at a document's last token, position_ids, document_ids and cu_seqlens from the
    document ends inside the sequence (documents of the bench are never empty)."""
    import numpy as np

    made, ramp = 0, np.arange(size, dtype=np.int64)
    for path, shard_ends in zip(paths, ends, strict=True):
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        for i in range(len(tokens) // size):
            lo = i * size
            window = tokens[lo : lo + size + 1].astype(np.int64)
            first, last = np.searchsorted(shard_ends, [lo, lo + size], side="right")
            cuts = shard_ends[first:last] - lo  # document ends inside, and one at size if it ends there
            labels = window[1:].copy()
            labels[cuts - 1] = -100
            starts = np.concatenate([[0], cuts[cuts < size]])
            lengths = np.diff(np.append(starts, size))
            cu = np.full(size + 1, size, dtype=np.int32)
            cu[: len(starts)] = starts
            sample = {
                "input_ids": window[:size],
                "labels": labels,
                "position_ids": ramp - np.repeat(starts, lengths),
                "document_ids": np.repeat(np.arange(first, first + len(starts)), lengths),
                "cu_seqlens": cu,
            }
            made += sample["input_ids"].size
    return made


_TWO_ARRAYS = "concat, input_ids+labels only"  # seq_fields=("input_ids", "labels")
_MAPPED = "concat, read mapped"  # local_reads="map"
_TWO_MAPPED = "concat, input_ids+labels, read mapped"
_OURS: dict[str, tuple[str, dict[str, object]]] = {  # each line of ours: packing and options
    "concat": ("concat", {}),
    "best_fit": ("best_fit", {}),
    _TWO_ARRAYS: ("concat", {"seq_fields": ("input_ids", "labels")}),
    _MAPPED: ("concat", {"local_reads": "map"}),
    _TWO_MAPPED: ("concat", {"seq_fields": ("input_ids", "labels"), "local_reads": "map"}),
}


@section("deliver")
def bench_deliver(args: argparse.Namespace) -> None:
    import tempfile
    import time

    import numpy as np

    import shardstream
    from shardstream.catalog import record_sequences
    from shardstream.formats.tokens import TokensIndex

    size = args.deliver_seq_len
    with tempfile.TemporaryDirectory() as folder:
        url = str(Path(folder) / "ds")
        rng = np.random.default_rng(0)
        per_shard = int(args.deliver_tokens) // 4
        with shardstream.ShardWriter(url, format="tokens", shard_size=per_shard * 2) as writer:
            written, number = 0, 0
            while written < args.deliver_tokens:
                n = int(max(1, rng.lognormal(6.4, 0.9)))
                writer.write(
                    {"__key__": f"{number:09d}", "tokens": rng.integers(0, 50000, n, dtype=np.uint16)}
                )
                written, number = written + n, number + 1
        manifest = record_sequences(url, size)  # best_fit's bins beside the shards
        paths = [str(Path(url) / info.path) for info in manifest.shards]

        def bare() -> int:
            made = 0
            for path in paths:
                tokens = np.memmap(path, dtype=np.uint16, mode="r")
                for i in range(len(tokens) // size):
                    window = tokens[i * size : (i + 1) * size + 1].astype(np.int64)
                    sample = {"input_ids": window[:size], "labels": window[1:]}
                    made += sample["input_ids"].size
            return made

        ends = [
            TokensIndex.from_bytes((Path(url) / info.index).read_bytes(), name=info.path).ends
            for info in manifest.shards
        ]

        firsts: dict[str, list[float]] = {name: [] for name in _OURS}  # to the first sample (s)
        steady: dict[str, list[float]] = {name: [] for name in _OURS}  # tokens/s after the first sample

        def ours(name: str) -> int:
            """The epoch's tokens; its start (the dataset built, the plan, the first
            window's reads and checks) and its rate after the first sample noted."""
            packing, given = _OURS[name]
            start = time.perf_counter()
            dataset = shardstream.StreamingDataset(
                url, seq_len=size, packing=packing, shuffle=True, seed=0, **given
            )
            samples = iter(dataset)
            made = next(samples)["input_ids"].size
            first = time.perf_counter()
            after = sum(sample["input_ids"].size for sample in samples)
            firsts[name].append(first - start)
            steady[name].append(after / (time.perf_counter() - first))
            return made + after

        for _ in range(2):  # warm the page cache for both
            bare()
        rates: dict[str, list[float]] = {"bare": [], "bare with masks": [], **{name: [] for name in _OURS}}
        for _ in range(args.deliver_rounds):  # paired rounds
            for name in rates:
                start = time.perf_counter()
                if name.startswith("bare"):
                    made = bare() if name == "bare" else _bare_masked(paths, ends, size)
                else:
                    made = ours(name)
                rates[name].append(made / (time.perf_counter() - start))
    best = {name: max(values) for name, values in rates.items()}
    paired: dict[str, float] = {}
    print(f"{int(args.deliver_tokens) / 1e6:.0f}M tokens in 4 shards (local disk), S={size}, one process")
    print(f"bare numpy memmap concat-and-chunk {best['bare'] / 1e6:8.1f} M tokens/s")
    print(f"the same, with masks               {best['bare with masks'] / 1e6:8.1f} M tokens/s")
    for name in ("concat", "best_fit"):
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["bare"], strict=True))
        masked = statistics.median(a / b for a, b in zip(rates[name], rates["bare with masks"], strict=True))
        print(
            f"shardstream {name:<9} with masks   {best[name] / 1e6:8.1f} M tokens/s   "
            f"{ratio:.2f}x of bare (median of paired rounds)"
        )
        print(f"  {name}: {masked:.2f}x of bare with masks (median of paired rounds)")
        paired[f"{name} / bare memmap"] = ratio
        paired[f"{name} / bare memmap with masks"] = masked
    # the same two arrays as bare makes (labels still -100 at document ends), and reading mapped
    for name in (_TWO_ARRAYS, _MAPPED, _TWO_MAPPED):
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["bare"], strict=True))
        print(
            f"shardstream {name:<38} {best[name] / 1e6:8.1f} M tokens/s   "
            f"{ratio:.2f}x of bare (median of paired rounds)"
        )
        paired[f"shardstream {name} / bare"] = ratio
    # the start is the epoch's only part that does not grow with its tokens: a worker's epoch
    # of a corpus many times this one's pays it once
    for name in ("concat", _TWO_ARRAYS, _TWO_MAPPED):
        after = statistics.median(a / b for a, b in zip(steady[name], rates["bare"], strict=True))
        print(
            f"  {name}: its first sample after {statistics.median(firsts[name]) * 1000:.1f} ms; from it on "
            f"{statistics.median(steady[name]) / 1e6:.1f} M tokens/s, {after:.2f}x of bare's whole epoch"
        )
        paired[f"shardstream {name} after its first sample / bare"] = after
    record(args, "tokens-deliver", {name: value / 1e6 for name, value in best.items()}, paired)


def _options_deliver_wan(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("deliver-wan")
    group.add_argument("--wan-shards", type=int, default=40, help="token shards on S3 (default: 40)")
    group.add_argument(
        "--wan-shard-tokens", type=float, default=4e6, help="tokens per shard on S3 (default: 4M, 8 MB)"
    )
    group.add_argument(
        "--wan-server",
        choices=("moto", "seaweedfs"),
        default="moto",
        help="the S3 server behind the proxy (default: moto, which copies the whole object for "
        "every ranged GET; SeaweedFS serves a range as stores do)",
    )


OPTIONS.append(_options_deliver_wan)


def _wan_corpus(url: str, shards: int, per_shard: int, options: dict[str, str]) -> None:
    """``shards`` token shards of about ``per_shard`` uint16 tokens each (lognormal documents,
    mean ~800 tokens) at ``url``, written straight to the store."""
    import numpy as np

    import shardstream

    rng = np.random.default_rng(0)
    with shardstream.ShardWriter(
        url, format="tokens", shard_size=per_shard * 2, storage_options=options
    ) as writer:
        written, number = 0, 0
        while written < shards * per_shard:
            n = int(max(1, rng.lognormal(6.4, 0.9)))
            writer.write({"__key__": f"{number:09d}", "tokens": rng.integers(0, 50000, n, dtype=np.uint16)})
            written, number = written + n, number + 1


def _wan_wire(client, bucket: str, prefix: str, shards: list, ranged: bool) -> int:  # type: ignore[no-untyped-def]
    """Every byte of the shard files through the proxy, as tools/bench_matrix.py's wire:
    whole objects in as many threads as shards (up to 16), or 8 MiB ranged GETs in 16
    threads; the tokens read (uint16)."""
    import concurrent.futures

    part = 8 << 20
    jobs = [
        (f"{prefix}/{info.path}", lo, min(lo + part, info.bytes) - 1)
        for info in shards
        for lo in (range(0, info.bytes, part) if ranged else [0])
    ]

    def get(job: tuple[str, int, int]) -> int:
        key, lo, hi = job
        given = {"Range": f"bytes={lo}-{hi}"} if ranged else {}
        return len(client.get_object(Bucket=bucket, Key=key, **given)["Body"].read())

    with concurrent.futures.ThreadPoolExecutor(16 if ranged else min(16, len(jobs))) as pool:
        return sum(pool.map(get, jobs)) // 2


def _document_tokens(sample: dict) -> int:  # type: ignore[type-arg]
    """The tokens of documents in a sequence: not its padding (document_ids -1 there)."""
    return int((sample["document_ids"] >= 0).sum())


@section("deliver-wan")
def bench_deliver_wan(args: argparse.Namespace) -> None:
    """Packed sequences from S3 behind the WAN proxy (moto or ``--wan-server seaweedfs``, 30 ms
    before each request, 40 MB/s per response) in one process, shuffled, an epoch of many windows (best_fit's bins recorded
    beside the shards), against the wire at its best in each round: the shard files as whole
    objects in threads, or as 8 MiB ranged GETs in 16 threads (tools/bench_matrix.py's two)."""
    import time

    import boto3

    import shardstream
    from shardstream.catalog import record_sequences

    sys.path.insert(0, str(ROOT / "tools"))
    from bench_matrix import BUCKET, s3_server
    from bench_wan import BANDWIDTH, LATENCY, ProxyProcess

    size, bucket, stack = args.deliver_seq_len, BUCKET, []
    try:
        direct, env = s3_server(args.wan_server, stack)
        proxy = ProxyProcess(direct["endpoint_url"], LATENCY, BANDWIDTH)
        stack.append(proxy)
        url = f"s3://{bucket}/tokens"
        _wan_corpus(url, args.wan_shards, int(args.wan_shard_tokens), direct)
        record_sequences(url, size, storage_options=direct)  # best_fit's bins beside the shards
        far = {**direct, "endpoint_url": proxy.endpoint}
        probe = shardstream.StreamingDataset(url, seq_len=size, shuffle=True, seed=0, storage_options=far)
        manifest, windows = probe.manifest, len(list(probe.make_plan(consume=False).worker_windows(0, 0)))
        client = boto3.client(
            "s3",
            endpoint_url=proxy.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

        firsts: dict[str, list[float]] = {"concat": [], "best_fit": []}  # built -> first sample (s)
        builds: dict[str, list[float]] = {"concat": [], "best_fit": []}  # StreamingDataset(...) (s)
        steady: dict[str, list[float]] = {"concat": [], "best_fit": []}  # tokens/s after the first sample

        def ours(packing: str) -> int:
            """The epoch's document tokens (best_fit's padding is not counted: the wire's
            tokens are the shards'); the round's rate counts from before the dataset is
            built, the first sample from after."""
            start = time.perf_counter()
            dataset = shardstream.StreamingDataset(
                url, seq_len=size, packing=packing, shuffle=True, seed=0, storage_options=far
            )
            built = time.perf_counter()
            samples = iter(dataset)
            made = _document_tokens(next(samples))
            first = time.perf_counter()
            after = sum(map(_document_tokens, samples))
            builds[packing].append(built - start)
            firsts[packing].append(first - built)
            steady[packing].append(after / (time.perf_counter() - first))
            return made + after

        runs: dict[str, Callable[[], int]] = {
            "whole objects": lambda: _wan_wire(client, bucket, "tokens", manifest.shards, ranged=False),
            "ranged parts": lambda: _wan_wire(client, bucket, "tokens", manifest.shards, ranged=True),
            "concat": lambda: ours("concat"),
            "best_fit": lambda: ours("best_fit"),
        }
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):  # paired rounds, each side by side
            for name, run in runs.items():
                start = time.perf_counter()
                made = run()
                rates[name].append(made / (time.perf_counter() - start))
    finally:
        for process in reversed(stack):
            process.stop()
    wire = [max(a, b) for a, b in zip(rates["whole objects"], rates["ranged parts"], strict=True)]
    tokens = sum(info.tokens or 0 for info in manifest.shards)
    print(
        f"{tokens / 1e6:.0f}M tokens in {len(manifest.shards)} shards of ~{args.wan_shard_tokens / 1e6:g}M "
        f"(uint16, lognormal documents of mean ~800 tokens) on S3 ({args.wan_server}) behind the WAN proxy "
        f"({LATENCY * 1000:.0f} ms, {BANDWIDTH / 1e6:.0f} MB/s per response), S={size}, shuffled, "
        f"{windows} windows in the epoch, one process; shardstream's rates count the tokens of "
        "documents (not best_fit's padding) from before the dataset is built, its first sample "
        "from after"
    )
    for name in ("whole objects", "ranged parts"):
        print(f"the wire, {name:<14}            {statistics.median(rates[name]) / 1e6:8.1f} M tokens/s")
    paired: dict[str, float] = {}
    for name in ("concat", "best_fit"):
        ratios = [a / b for a, b in zip(rates[name], wire, strict=True)]
        print(
            f"shardstream {name:<9} with masks     {statistics.median(rates[name]) / 1e6:8.1f} M tokens/s   "
            f"{statistics.median(ratios):.2f}x of the wire (the better of the two in each round; median)"
        )
        paired[f"{name} / the wire"] = statistics.median(ratios)
        after = statistics.median(a / b for a, b in zip(steady[name], wire, strict=True))
        print(
            f"  {name}: built in {statistics.median(builds[name]) * 1000:.0f} ms, then its first sample "
            f"after {statistics.median(firsts[name]) * 1000:.0f} ms; from it on "
            f"{statistics.median(steady[name]) / 1e6:.1f} M tokens/s, {after:.2f}x of the wire's whole epoch"
        )
        paired[f"{name} after its first sample / the wire"] = after
    medians = {name: statistics.median(values) / 1e6 for name, values in rates.items()}
    medians["wire"] = statistics.median(wire) / 1e6
    claim = "tokens-deliver-wan" if args.wan_server == "moto" else "tokens-deliver-wan-seaweedfs"
    record(args, claim, medians, paired)


# -- sections start, deliver (end) --


def record(args: argparse.Namespace, claim: str, figures: dict[str, float], ratios: dict[str, float]) -> None:
    """With ``--record``: append the section's figures to docs/benchmarks.json (tools/results.py)."""
    if args.record:
        sys.path.insert(0, str(ROOT / "tools"))
        from results import command_line
        from results import record as append

        append(claim, command_line(), figures, ratios=ratios)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    parser.add_argument("--record", action="store_true", help="append the figures to docs/benchmarks.json")
    for add in OPTIONS:
        add(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in args.only or list(SECTIONS):
        print(f"== {name}", flush=True)
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
