"""Ray writes a shardstream dataset (local Ray, 2 CPUs, one for the module): exactly once
through a write task killed mid-write, nothing left by a failed write, and the same files
as ``pack --part`` (and so as Spark: tests/test_engine_spark.py)."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("ray")

import pandas as pd
import ray

import shardstream.ray
from shardstream.pack.attempt import write_partition
from tests.engine_helpers import (
    PARTITIONS,
    check_exactly_once,
    files_of,
    packed_by_parts,
    partition,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _dataset():
    """The rows in ``PARTITIONS`` blocks (the slices of ``pack --part``): one write task each."""
    return ray.data.from_pandas([pd.DataFrame(partition(p)) for p in range(PARTITIONS)])


def _sink(marker, action, url, **options):
    """A Datasink whose task 1 does ``action`` after 25 rows (3 shards stored) the first time."""

    class Failing(shardstream.ray.Datasink):
        def write(self, blocks, ctx):
            def rows():
                for n, row in enumerate(shardstream.ray._rows(blocks)):
                    if ctx.task_idx == 1 and n == 25 and not os.path.exists(marker):
                        open(marker, "w").close()
                        action()
                    yield row

            return write_partition(self.job, ctx.task_idx, rows())

    return Failing(url, **options)


def _kill():
    os.kill(os.getpid(), signal.SIGKILL)


def _raise():
    raise RuntimeError("injected failure")


def test_a_task_killed_mid_write_writes_each_row_once_and_equals_pack(local_ray, s3, tmp_path):
    url, options = s3
    marker = str(tmp_path / "killed")
    sink = _sink(marker, _kill, f"{url}/corpus", format="tar", samples_per_shard=7, storage_options=options)
    _dataset().write_datasink(sink)
    assert os.path.exists(marker)
    check_exactly_once(f"{url}/corpus", options)
    assert files_of(f"{url}/corpus", options) == files_of(packed_by_parts(str(tmp_path), "tar", 7))


def test_a_failed_write_leaves_no_manifest_and_no_files(local_ray, s3, tmp_path):
    url, options = s3
    sink = _sink(str(tmp_path / "failed"), _raise, f"{url}/failed", format="parquet", storage_options=options)
    with pytest.raises(Exception, match="injected failure"):
        _dataset().write_datasink(sink)
    assert files_of(url, options) == {}
