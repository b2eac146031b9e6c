"""Microbenchmark of the shard codecs: encoder and decode samples/s, one process.

    python tools/bench_formats.py [--samples 100000] [--repeat 3]

Samples are small, as in a text or label corpus: three fields of ~300 bytes in all.
Prints the best of ``--repeat`` runs; nothing is asserted (tests never time things).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import mmap
import tempfile
import time
from collections.abc import Callable

from shardstream.formats import get_format
from shardstream.types import ByteRange


def make_samples(n: int) -> list[dict]:
    return [
        {
            "__key__": f"sample{i:09d}",
            "txt": b"lorem ipsum dolor sit amet %d " % i * 7,
            "json": b'{"id": %d, "lang": "en", "score": 0.5}' % i,
            "cls": b"%d" % (i % 1000),
        }
        for i in range(n)
    ]


def best(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


class NullSink:
    """Discards what it is given: measures the encoder alone."""

    def write(self, data) -> int:
        return len(data)


class HashingSink:
    """Hashes what it is given, as a pack does before the bytes go to storage."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return len(data)


def encode(fmt, samples: list[dict], sink) -> object:
    encoder = fmt.encoder(sink, name="bench")
    write = encoder.write
    for sample in samples:
        write(sample)
    return encoder.close()


def bench(fmt_name: str, samples: list[dict], repeat: int, run: int) -> None:
    fmt = get_format(fmt_name)
    n = len(samples)
    buffer = io.BytesIO()
    index = encode(fmt, samples, buffer)
    data = buffer.getvalue()
    size = len(data)
    t_enc = best(repeat, lambda: encode(fmt, samples, NullSink()))
    t_pack = best(repeat, lambda: encode(fmt, samples, HashingSink()))
    whole = ByteRange(0, size)

    def decode_all():
        for _ in fmt.decode(data, whole, index, 0, n, name="bench"):
            pass

    def decode_runs():  # ranged reads of `run` consecutive samples, as a worker does
        for start in range(0, n, run):
            stop = min(n, start + run)
            rng = index.byte_range(start, stop)
            chunk = data[rng.start : rng.end]
            for _ in fmt.decode(chunk, rng, index, start, stop, name="bench"):
                pass

    with tempfile.TemporaryFile() as f:  # a mapped shard, as the dataset reads local files
        f.write(data)
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            t_mapped = best(
                repeat, lambda: sum(1 for _ in fmt.decode(view, whole, index, 0, n, name="bench"))
            )
            view.release()
    from shardstream.formats.checks import BlockHasher

    hasher = BlockHasher()
    hasher.update(data)
    checks = hasher.checks()
    t_check = best(repeat, lambda: checks.bad_blocks(data, ByteRange(0, size)))  # what a read checks
    t_dec = best(repeat, decode_all)
    t_runs = best(repeat, decode_runs)
    t_index = best(repeat, lambda: fmt.build_index(io.BytesIO(data), name="bench"))
    print(f"{fmt_name}: {n} samples, shard {size / 1e6:.1f} MB, index {len(index.to_bytes()) / 1e3:.0f} kB")
    print(f"  encoder alone      {n / t_enc:>12,.0f} samples/s")
    print(f"  encoder + sha256   {n / t_pack:>12,.0f} samples/s")
    print(f"  decode whole shard {n / t_dec:>12,.0f} samples/s")
    print(f"  decode runs of {run:<4}{n / t_runs:>12,.0f} samples/s")
    print(f"  decode mapped file {n / t_mapped:>12,.0f} samples/s")
    print(f"  block CRC check    {n / t_check:>12,.0f} samples/s (NOTE [ Checksummed reads ])")
    print(f"  build_index        {n / t_index:>12,.0f} samples/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--run", type=int, default=256, help="samples per ranged decode")
    parser.add_argument("--formats", default="tar,parquet")
    args = parser.parse_args()
    samples = make_samples(args.samples)
    for name in args.formats.split(","):
        bench(name, samples, args.repeat, args.run)


if __name__ == "__main__":
    main()
