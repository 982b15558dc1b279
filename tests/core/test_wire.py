"""The wire format of checkpoints, wait records and events (seed 000 §1, SPEC §2)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import siglo
from siglo import Checkpoint, MalformedRecordError, WaitRecord
from siglo.records import CacheEvent, ContextChangeEvent

WIRE = {
    "version": 2,
    "schemaVersion": "2.0.0",
    "stackId": "stack-1",
    "workflowId": "wf",
    "namespace": "tenant-a",
    "type": "execution",
    "status": "waiting",
    "revision": 3,
    "chains": ["a", "b"],
    "contexts": {"step": {"x": 1, "nested": {"y": [1, {"z": None}]}}},
    "timestamp": 1_700_000_000_000,
    "expiresAt": 1_700_000_100_000,
    "metadata": {"waitRecord": {"correlationKey": "k"}},
}


@pytest.mark.rule("wire.checkpoint")
def test_checkpoint_reads_and_writes_the_seed_document() -> None:
    cp = Checkpoint.from_json(orjson.dumps(WIRE))
    assert cp.stack_id == "stack-1"
    assert cp.schema_version == "2.0.0"
    assert cp.workflow_id == "wf"
    assert cp.expires_at == 1_700_000_100_000
    assert cp.chains == ("a", "b")
    assert cp.to_wire() == WIRE
    assert list(cp.to_wire()) == list(WIRE)  # the seed's key order
    assert orjson.loads(cp.to_json()) == WIRE


@pytest.mark.rule("wire.checkpoint")
def test_absent_optional_fields_are_omitted_and_null_reads_as_absent() -> None:
    cp = Checkpoint(stack_id="s", revision=1, timestamp=5)
    doc = cp.to_wire()
    for key in ("workflowId", "namespace", "expiresAt", "metadata"):
        assert key not in doc
    assert type(doc["timestamp"]) is int
    assert Checkpoint.from_wire({**doc, "namespace": None}).namespace is None


@pytest.mark.rule("wire.checkpoint")
def test_unknown_fields_survive_a_round_trip() -> None:
    cp = Checkpoint.from_wire({**WIRE, "futureField": {"a": 1}})
    assert cp.to_wire()["futureField"] == {"a": 1}


@pytest.mark.rule("wire.checkpoint")
def test_checkpoint_is_immutable() -> None:
    cp = Checkpoint.from_wire(WIRE)
    with pytest.raises(AttributeError):
        cp.revision = 4  # type: ignore[misc]
    assert cp.replace(revision=4).revision == 4
    assert cp.revision == 3


@pytest.mark.rule("wire.version")
@pytest.mark.parametrize("version", [3, 99])
def test_future_storage_version_is_refused(version: int) -> None:
    with pytest.raises(siglo.CheckpointVersionError) as info:
        Checkpoint.from_wire({**WIRE, "version": version})
    assert info.value.version == version
    assert siglo.CheckpointVersionException is siglo.CheckpointVersionError
    # A future document is refused before its (possibly new) layout is examined.
    with pytest.raises(siglo.CheckpointVersionError):
        Checkpoint.from_wire({"version": 3, "somethingNew": True})


@pytest.mark.rule("wire.malformed")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stackId": 5}, "stackId"),
        ({"revision": "3"}, "revision"),
        ({"revision": True}, "revision"),
        ({"revision": -1}, "revision"),
        ({"timestamp": 1.5}, "timestamp"),
        ({"status": "sleeping"}, "status"),
        ({"chains": ["a", 1]}, "chains[1]"),
        ({"contexts": {"step": 1}}, "contexts.step"),
        ({"contexts": []}, "contexts"),
        ({"metadata": []}, "metadata"),
        ({"expiresAt": "soon"}, "expiresAt"),
        ({"schemaVersion": "3.0.0"}, "schemaVersion"),
        ({"version": 1}, "version"),
        ({"version": "2"}, "version"),
    ],
)
def test_malformed_checkpoint_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(MalformedRecordError) as info:
        Checkpoint.from_wire({**WIRE, **change})
    assert info.value.field == field
    assert field in str(info.value)
    assert not isinstance(info.value, siglo.CheckpointVersionError) or field == "version"


@pytest.mark.rule("wire.malformed")
@pytest.mark.parametrize("missing", ["stackId", "revision", "contexts", "chains", "timestamp"])
def test_missing_field_is_named(missing: str) -> None:
    doc = {k: v for k, v in WIRE.items() if k != missing}
    with pytest.raises(MalformedRecordError, match=missing):
        Checkpoint.from_wire(doc)


@pytest.mark.rule("wire.malformed")
def test_not_json_and_not_an_object() -> None:
    with pytest.raises(MalformedRecordError):
        Checkpoint.from_json(b"{not json")
    with pytest.raises(MalformedRecordError, match="object"):
        Checkpoint.from_json(b"[1, 2]")


@pytest.mark.rule("wire.malformed")
def test_construction_in_python_is_validated_too() -> None:
    with pytest.raises(MalformedRecordError, match="stackId"):
        Checkpoint(stack_id=None, revision=1, timestamp=1)  # type: ignore[arg-type]
    with pytest.raises(siglo.CheckpointVersionError):
        Checkpoint(stack_id="s", revision=1, timestamp=1, version=3)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@pytest.mark.rule("wire.checkpoint")
@given(
    stack_id=st.text(min_size=1),
    namespace=st.none() | st.text(min_size=1),
    revision=st.integers(0, 2**40),
    contexts=st.dictionaries(st.text(), st.dictionaries(st.text(), json_values), max_size=3),
    chains=st.lists(st.text(), max_size=3),
    status=st.sampled_from(sorted(siglo.checkpoint.STATUSES)),
)
def test_any_checkpoint_round_trips(
    stack_id: str,
    namespace: str | None,
    revision: int,
    contexts: dict[str, dict[str, Any]],
    chains: list[str],
    status: siglo.Status,
) -> None:
    cp = Checkpoint(
        stack_id=stack_id,
        namespace=namespace,
        revision=revision,
        timestamp=1,
        contexts=contexts,
        chains=tuple(chains),
        status=status,
    )
    assert Checkpoint.from_json(cp.to_json()) == cp


@pytest.mark.rule("wire.malformed")
def test_wait_record_and_events_round_trip_and_validate() -> None:
    record = WaitRecord(
        correlation_key="order:1",
        stack_id="s",
        step_id="pay",
        created_at=1,
        expires_at=2,
        event_payload={"ok": True},
    )
    assert record.to_wire() == {
        "correlationKey": "order:1",
        "stackId": "s",
        "status": "waiting",
        "stepId": "pay",
        "createdAt": 1,
        "expiresAt": 2,
        "eventPayload": {"ok": True},
    }
    assert WaitRecord.from_json(record.to_json()) == record
    with pytest.raises(MalformedRecordError, match="status"):
        WaitRecord.from_wire({"correlationKey": "k", "stackId": "s", "status": "done"})
    with pytest.raises(MalformedRecordError, match="correlationKey"):
        WaitRecord.from_wire({"stackId": "s", "status": "waiting"})

    event = ContextChangeEvent(stack_id="s", step_id="a", key="k", value=[1], timestamp=3)
    assert ContextChangeEvent.from_wire(event.to_wire()) == event
    with pytest.raises(MalformedRecordError, match="op"):
        ContextChangeEvent(stack_id="s", step_id="a", key="k", timestamp=3, op="merge")  # type: ignore[arg-type]

    cache_event = CacheEvent(type="hit", key="k", timestamp=1, ttl_ms=5)
    assert CacheEvent.from_wire(cache_event.to_wire()) == cache_event
    with pytest.raises(MalformedRecordError, match="type"):
        CacheEvent.from_wire({"type": "boom", "key": "k", "timestamp": 1})
