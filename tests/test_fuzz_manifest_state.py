"""Fuzz: hostile manifests and resume states give a ShardstreamError or load soundly,
never another exception (issue 10, "Keep it so").

Bounded for CI: each property runs 150 cheap examples, a second or two each.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.errors import ManifestError, ShardstreamError
from shardstream.manifest import Manifest
from shardstream.plan import EpochPlan, PlanConfig
from shardstream.sampler import ShardSampler
from tests.resume_harness import write_dataset

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

EDGE_INTEGERS = st.sampled_from(
    [0, 1, -1, 2, 7, 1 << 31, 1 << 53, (1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 63)]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | EDGE_INTEGERS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)


def _sha(i: int) -> str:
    return f"{i:x}" * 64 if i < 16 else "a" * 64


VALID = Manifest(
    "tar",
    tuple(
        shardstream.ShardInfo(f"shard-{i:06d}.tar", n, 1024 * (i + 1), _sha(i), f"shard-{i:06d}.tar.idx", 80)
        for i, n in enumerate([5, 0, 9])
    ),
    fields=("cls", "txt"),
    writer="shardstream test",
).to_dict()


def _locations(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path of keys/indices into a JSON document (the root included)."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _locations(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _locations(value, (*prefix, index))
    return found


@st.composite
def mutated(draw: Any, base: dict[str, Any], steps: int = 3) -> Any:
    """``base`` with a few edits: a value replaced, a key deleted, a list entry repeated."""
    document: Any = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, steps))):
        where = draw(st.sampled_from(_locations(document)))
        if not where:
            document = draw(JSON) if draw(st.integers(0, 9)) == 0 else document
            continue
        parent = document
        for part in where[:-1]:
            parent = parent[part]
        last = where[-1]
        action = draw(st.sampled_from(["replace", "edge", "delete", "repeat"]))
        if action == "replace":
            parent[last] = draw(JSON)
        elif action == "edge":
            parent[last] = draw(EDGE_INTEGERS | st.sampled_from([0.5, 25.0, True, False, "1", None]))
        elif action == "delete" and isinstance(parent, dict):
            del parent[last]
        elif action == "delete":
            parent.pop(last)
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
    return document


def _check_manifest_text(text: str | bytes) -> None:
    try:
        manifest = Manifest.from_json(text, url="fuzz/manifest.json")
    except ManifestError as error:
        refusal = error
    else:
        refusal = None
    if refusal is not None:
        assert refusal.url == "fuzz/manifest.json"
        assert len(str(refusal)) < 2000  # a hostile value is not echoed whole
        return
    # what loads is sound: it round-trips, each path once, counts are integers
    assert Manifest.from_json(manifest.to_json()) == manifest
    paths = [p for s in manifest.shards for p in (s.path, s.index)]
    assert len(paths) == len(set(paths))
    for shard in manifest.shards:
        for count in (shard.samples, shard.bytes, shard.index_bytes):
            assert type(count) is int
            assert 0 <= count < 1 << 63


def test_the_fuzz_base_manifest_is_valid():
    assert Manifest.from_json(json.dumps(VALID)).num_samples == 14


@FUZZ
@given(st.binary(max_size=600))
def test_fuzz_manifest_bytes(data):
    _check_manifest_text(data)


@FUZZ
@given(JSON)
def test_fuzz_manifest_json_values(value):
    _check_manifest_text(json.dumps(value))


@FUZZ
@given(mutated(VALID))
def test_fuzz_manifest_mutations(document):
    _check_manifest_text(json.dumps(document))


@FUZZ
@given(st.data())
def test_fuzz_manifest_text_edits(data):
    text = bytearray(json.dumps(VALID).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text) - 1))
        text[at : at + data.draw(st.integers(0, 3))] = data.draw(st.binary(max_size=3))
    _check_manifest_text(bytes(text))


# -- resume states ----------------------------------------------------------------------------

SIZES = [5, 7, 4, 0, 6]


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """A real tar dataset and a DataLoader state 3 batches into its epoch 1."""
    url = str(tmp_path_factory.mktemp("fuzz") / "ds")
    write_dataset(url, SIZES)
    dataset = shardstream.StreamingDataset(url, seed=3, shuffle_window=6)
    dataset.set_epoch(1)
    loader = shardstream.DataLoader(dataset, batch_size=2)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    return url, loader.state_dict()


def _check_loaded(dataset: shardstream.StreamingDataset) -> None:
    plan = dataset.make_plan(consume=False)
    assert 0 <= plan.samples_per_rank() <= 2 * sum(SIZES)
    for shard, index in itertools.islice(plan.worker_samples(0, 0), 50):
        assert 0 <= index < SIZES[shard]


def _load(subject: Any, state: Any) -> bool:
    """True if ``subject`` took ``state``; False if it refused it with a ShardstreamError."""
    try:
        subject.load_state_dict(state)
    except ShardstreamError as error:
        message = str(error)
    else:
        return True
    assert len(message) < 2000  # a hostile value is not echoed whole
    return False


@FUZZ
@given(st.data())
def test_fuzz_dataset_and_loader_states(streamed, data):
    url, state = streamed
    document = data.draw(mutated(state, steps=2) | mutated(state, steps=4) | JSON)
    dataset = shardstream.StreamingDataset(url, seed=3, shuffle_window=6)
    loader = shardstream.DataLoader(dataset, batch_size=data.draw(st.sampled_from([1, 2, 3])))
    if _load(loader, document):
        _check_loaded(dataset)
    if _load(dataset, document):
        _check_loaded(dataset)


@FUZZ
@given(st.data())
def test_fuzz_plan_and_sampler_states(streamed, data):
    _, state = streamed
    document = data.draw(mutated(state["plan"], steps=2) | mutated(state["plan"], steps=4) | JSON)
    world = data.draw(st.sampled_from([1, 2, 3]))
    sampler = ShardSampler(SIZES, num_replicas=world, rank=world - 1, seed=3, shuffle_window=6)
    if _load(sampler, document):
        indices = list(itertools.islice(iter(sampler), 50))
        assert all(0 <= i < sum(SIZES) for i in indices)
    try:
        plan = EpochPlan.resume(SIZES, PlanConfig(seed=3, shuffle_window=6), document, world_size=world)
    except ShardstreamError:
        return
    samples = list(itertools.islice(plan.worker_samples(world - 1, 0), 50))
    assert all(0 <= shard < len(SIZES) and 0 <= index < SIZES[shard] for shard, index in samples)
