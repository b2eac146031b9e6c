"""The main job, end to end on one machine: pack a real corpus to S3, stream it with 2 ranks.

    python tools/demo.py [--ranks 2] [--workers 2] [--epochs 2] [--keep-going]

1. starts an S3 server on 127.0.0.1 (moto, in this process; MinIO in docker/ does the same
   for real deployments),
2. writes the Python standard library's source files as a JSON Lines corpus of text
   samples and packs it with ``shardstream pack`` into ``s3://demo/stdlib``,
3. runs ``shardstream inspect`` and ``shardstream verify`` on it,
4. streams it with ``torchrun --standalone --nproc_per_node=2`` (gloo, 2 DataLoader
   workers per rank) through ``tools/demo_train.py``, which checks that every sample was
   seen exactly once per epoch, that all ranks got equal counts, and that the second
   epoch came in another order, and prints the throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardstream.testing import MotoServer


def write_corpus(path: pathlib.Path) -> int:
    """One text sample per source file of the standard library (site-packages excluded)."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for source in sorted(stdlib.rglob("*.py")):
            relative = source.relative_to(stdlib).as_posix()
            if relative.startswith(("site-packages/", "dist-packages/")):
                continue
            text = source.read_text(encoding="utf-8", errors="replace")
            # webdataset treats names starting with "__" as metadata, and a key ends at the first dot
            slug = relative[: -len(".py")].replace("__", "").replace(".", "_")
            key = f"{count:05d}-{slug}"
            out.write(json.dumps({"__key__": key, "txt": text}) + "\n")
            count += 1
    return count


def run(command: list[str], env: dict[str, str]) -> None:
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, env=env, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--write-corpus", metavar="PATH", help="only write the JSON Lines corpus to PATH and exit"
    )
    args = parser.parse_args()
    if args.write_corpus:
        print(f"corpus: {write_corpus(pathlib.Path(args.write_corpus))} source files of the standard library")
        return 0

    server = MotoServer()
    server.start()
    try:
        server.create_bucket("demo")
        env = {**os.environ, **server.env()}
        print(f"S3 endpoint on loopback: {server.endpoint}", flush=True)
        with tempfile.TemporaryDirectory(prefix="demo-") as tmp:
            corpus = pathlib.Path(tmp) / "stdlib.jsonl"
            print(f"corpus: {write_corpus(corpus)} source files of the standard library", flush=True)
            url = "s3://demo/stdlib"
            cli = [sys.executable, "-m", "shardstream"]
            run([*cli, "pack", str(corpus), url, "--shard-size", "2MB", "--overwrite"], env)
            run([*cli, "inspect", url], env)
            run([*cli, "verify", url], env)
            run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc_per_node={args.ranks}",
                    str(ROOT / "tools" / "demo_train.py"),
                    url,
                    "--workers",
                    str(args.workers),
                    "--epochs",
                    str(args.epochs),
                    "--batch-size",
                    str(args.batch_size),
                ],
                env,
            )
    finally:
        server.stop()
    print("demo: OK", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
