"""A local S3 endpoint for development: moto's S3 server on 127.0.0.1.

    python tools/local_s3.py [--port 9000] [--bucket demo]

prints the variables to export so that ``shardstream`` and ``torchrun`` reach it, and
serves until Ctrl-C. Data lives in memory and is gone when it stops.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from shardstream.testing import MotoServer  # one implementation serves tests, tools and the demo


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    args = parser.parse_args()
    server = MotoServer(port=args.port)
    server.start()
    for bucket in args.bucket:
        server.create_bucket(bucket)
    for name, value in server.env().items():
        print(f"export {name}={value}")
    print("# serving S3 on loopback; Ctrl-C stops it", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
