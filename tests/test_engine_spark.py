"""Spark writes a shardstream dataset (local mode, one session for the module): exactly once
through a failed attempt with speculation on, nothing left by an aborted job, and the
same files as ``pack --part`` (and so as Ray: tests/test_engine_ray.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java (17)", allow_module_level=True)

from pyspark import TaskContext
from pyspark.sql import SparkSession

import shardstream.spark
from tests.engine_helpers import (
    PARTITIONS,
    ROWS,
    SPARK_SCHEMA,
    check_exactly_once,
    files_of,
    packed_by_parts,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers run this venv's Python
    session = (
        SparkSession.builder.master("local[2,4]")  # 2 threads, a task tried up to 4 times
        .config("spark.speculation", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("FATAL")
    shardstream.spark.register(session)
    yield session
    session.stop()


def _frame(spark, fail=None):
    """``ROWS`` in ``PARTITIONS`` partitions (the slices of ``pack --part``); ``fail(partition,
    attempt)`` says where a task fails, after it wrote some shards."""

    def rows(index, items):
        attempt = TaskContext.get().attemptNumber()
        for n, row in enumerate(items):
            if fail is not None and n == 25 and fail(index, attempt):
                raise RuntimeError(f"injected failure of partition {index}, attempt {attempt}")
            yield row

    rdd = spark.sparkContext.parallelize([tuple(r.values()) for r in ROWS], PARTITIONS)
    return spark.createDataFrame(rdd.mapPartitionsWithIndex(rows), SPARK_SCHEMA)


def _write(frame, url, options, fmt="tar", mode="append"):
    (
        frame.write.format("shardstream")
        .option("format", fmt)
        .option("samples_per_shard", 7)
        .option("storage_options", json.dumps(options))
        .mode(mode)
        .save(url)
    )


def test_a_failed_first_attempt_writes_each_row_once_and_equals_pack(spark, s3, tmp_path):
    url, options = s3
    failed = tmp_path / "failed"

    def fail(partition, attempt):
        if partition == 1 and attempt == 0:
            failed.touch()  # the task has stored 3 shards of its attempt by now
            return True
        return False

    _write(_frame(spark, fail), f"{url}/corpus", options, mode="overwrite")
    assert failed.exists()
    check_exactly_once(f"{url}/corpus", options)
    assert files_of(f"{url}/corpus", options) == files_of(packed_by_parts(str(tmp_path), "tar", 7))
    with pytest.raises(Exception, match="the destination holds"):  # append: refused, as pack is
        _write(_frame(spark), f"{url}/corpus", options)


def test_an_aborted_job_leaves_no_manifest_and_no_files(spark, s3):
    url, options = s3
    frame = _frame(spark, fail=lambda partition, attempt: partition == 2)
    with pytest.raises(Exception, match="injected failure"):
        _write(frame, f"{url}/aborted", options, fmt="parquet")
    assert files_of(url, options) == {}
