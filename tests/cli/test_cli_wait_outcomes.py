"""What people read about waits (issue 31, item 12), on real SQLite, PostgreSQL and Redis
stores: a timed-out wait is "timed out", never "already delivered"; delivered, timed out
and cancelled are told apart in `siglo show` and in the error of a refused delivery; a
sleeping run shows "sleeping until <time>", not siglo's internal key; lease times print
as ISO-8601 with a relative time (epoch ms stay in --json); `siglo rm --json`.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from click.testing import CliRunner, Result
from ops_support import DURABLE_KINDS, shared_store

import siglo
from siglo import Step, WaitRecord, flow, wait_for_event
from siglo.cli import cli
from siglo.clock import system_clock
from siglo.errors import WaitRecordClaimError, WaitTimeoutError
from siglo.moments import iso_ms
from siglo.workflow import Worker, sleep

NS = "shop"


async def invoke(*args: str) -> Result:
    # In a thread: each command runs its own event loop, as in a shell.
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), catch_exceptions=False)


async def approve(_: Any) -> str:
    order = siglo.workflow.run_input()
    # Order 1's wait is to time out; the others' outlive a loaded machine's slowest run
    # of the test (with 300 ms each, order 2's deadline once passed before its delivery).
    timeout_ms = 300 if order == 1 else 600_000
    try:
        return str(await wait_for_event(f"approve:{order}", timeout_ms=timeout_ms))
    except WaitTimeoutError:
        return "nobody"


async def nap(_: Any) -> str:
    await sleep(3_600_000)
    return "rested"


orders = flow(Step.create("approve", approve), name="orders")
naps = flow(Step.create("nap", nap), name="naps")


async def suspended(run: Any) -> None:
    with pytest.raises(siglo.WorkflowSuspended):
        await run


async def show(url: str, stack_id: str) -> tuple[dict[str, Any], str]:
    doc = await invoke("show", url, stack_id, "--namespace", NS, "--json")
    assert doc.exit_code == 0, doc.output
    text = await invoke("show", url, stack_id, "--namespace", NS)
    assert text.exit_code == 0, text.output
    return json.loads(doc.output), text.output


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_timed_out_delivered_and_cancelled_are_told_apart(kind: str) -> None:
    async with shared_store(kind) as backend:
        manager = siglo.StorageManager(backend)
        for i in (1, 2, 3):
            await suspended(orders.run(i, manager=manager, stack_id=f"order-{i}", namespace=NS))
        assert await orders.deliver("approve:2", "ada", manager=manager, namespace=NS) == "ada"
        await backend.adapter.cancel_workflow("order-3", NS)
        await asyncio.sleep(0.4)  # order-1's deadline passes; a worker fires it
        assert (await Worker(manager, [orders]).run_once()).timers_fired == 1

        with pytest.raises(WaitRecordClaimError) as late:
            await orders.deliver("approve:1", "bob", manager=manager, namespace=NS)
        assert "timed out" in str(late.value) and "already delivered" not in str(late.value)
        with pytest.raises(WaitRecordClaimError, match="already delivered"):
            await orders.deliver("approve:2", "bob", manager=manager, namespace=NS)
        with pytest.raises(WaitRecordClaimError, match="cancelled"):
            await orders.deliver("approve:3", "bob", manager=manager, namespace=NS)

        for stack_id, outcome in (
            ("order-1", "timed out"),
            ("order-2", "delivered"),
            ("order-3", "cancelled"),
        ):
            doc, text = await show(backend.url, stack_id)
            assert [w["outcome"] for w in doc["waitRecords"]] == [outcome], stack_id
            assert outcome in text, (stack_id, text)
        # The wire status stays what is stored.
        doc, _ = await show(backend.url, "order-1")
        assert doc["waitRecords"][0]["status"] == "completed"


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_a_sleeping_run_shows_what_it_waits_for(kind: str) -> None:
    async with shared_store(kind) as backend:
        manager = siglo.StorageManager(backend)
        before = system_clock.now_ms()
        with pytest.raises(siglo.WorkflowSuspended) as asleep:
            await naps.run(None, manager=manager, stack_id="nap-1", namespace=NS)
        # What the run's own exception says, the first time and on a later run:
        assert "siglo-sleep" not in str(asleep.value)
        assert re.search(r"sleeping in step 'nap' until \d{4}-\d\d-\d\dT", str(asleep.value))
        with pytest.raises(siglo.WorkflowSuspended) as still:
            await naps.run(None, manager=manager, stack_id="nap-1", namespace=NS)
        assert str(still.value) == str(asleep.value)
        doc, text = await show(backend.url, "nap-1")
        assert doc["waitingFor"].startswith("sleeping until ")
        assert doc["waitRecords"][0]["outcome"] == "sleeping"
        assert "sleeping until" in text and "(in 1 h)" in text
        wake = doc["waitRecords"][0]["expiresAt"]
        assert wake >= before + 3_600_000
        assert iso_ms(wake) in text
        # siglo's own key for the sleep is not shown to people (--json keeps it).
        assert "siglo-sleep" not in text
        assert doc["waitRecords"][0]["correlationKey"].startswith("siglo-sleep")


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_lease_times_print_as_iso_8601(kind: str) -> None:
    async with shared_store(kind) as backend:
        manager = siglo.StorageManager(backend)
        await suspended(orders.run(7, manager=manager, stack_id="order-7", namespace=NS))
        claimed = await backend.adapter.claim_wait_record(
            "approve:7", "courier", lease_ms=600_000, namespace=NS
        )
        assert isinstance(claimed, WaitRecord) and claimed.lease_expires_at is not None
        lease = claimed.lease_expires_at
        doc, text = await show(backend.url, "order-7")
        assert doc["waitRecords"][0]["leaseExpiresAt"] == lease  # ms for scripts
        assert doc["waitRecords"][0]["outcome"] == "claimed"
        assert iso_ms(lease) in text and "(in 10 min)" in text
        assert str(lease) not in text
        with pytest.raises(WaitRecordClaimError) as busy:
            await orders.deliver("approve:7", "x", manager=manager, namespace=NS)
        message = str(busy.value)
        assert iso_ms(lease) in message and "epoch ms" not in message
        assert not re.search(r"\b\d{13}\b", message), message


@pytest.mark.parametrize("kind", DURABLE_KINDS)
async def test_rm_json(kind: str) -> None:
    async with shared_store(kind) as backend:
        manager = siglo.StorageManager(backend)
        await suspended(orders.run(8, manager=manager, stack_id="order-8", namespace=NS))
        url = backend.url
        conflict = await invoke("rm", url, "order-8", "-n", NS, "--revision", "1", "--json")
        assert conflict.exit_code == 1
        assert json.loads(conflict.stdout) == {
            "stackId": "order-8",
            "namespace": NS,
            "deleted": False,
            "currentRevision": 2,
            "expectedRevision": 1,
        }
        done = await invoke("rm", url, "order-8", "-n", NS, "--json")
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout) == {"stackId": "order-8", "namespace": NS, "deleted": True}
        assert await backend.adapter.get_wait_record("approve:8", namespace=NS) is None
        gone = await invoke("rm", url, "order-8", "-n", NS, "--json")
        assert gone.exit_code == 1
        assert json.loads(gone.stdout)["deleted"] is False
        assert "no stack 'order-8' in namespace 'shop'" in gone.stderr


def test_every_outcome_and_relative_times() -> None:
    from siglo import Checkpoint
    from siglo.moments import describe_ms, relative_ms
    from siglo.workflow.outcomes import wait_outcome, waiting_for

    now = 1_800_000_000_000
    key = "siglo-sleep\x1fshop\x1fnap-1\x1fnap"

    def w(**fields: Any) -> WaitRecord:
        return WaitRecord(**{"correlation_key": "k", "stack_id": "s", "step_id": "a", **fields})

    def cp(**context: Any) -> Checkpoint:
        return Checkpoint(stack_id="s", revision=1, timestamp=now, contexts={"a": context})

    cases = [
        (w(), None, "waiting"),
        (w(correlation_key=key), None, "sleeping"),
        (w(expires_at=now - 1), None, "due"),
        (w(status="claimed", claimant_id="c", lease_expires_at=now + 1), None, "claimed"),
        (w(status="claimed", claimant_id="c", lease_expires_at=now), None, "claim lapsed"),
        (w(status="completed"), cp(event="ok", output=1), "delivered"),
        (w(status="completed"), cp(timedOut=True, output=1), "timed out"),
        (w(status="completed"), None, "delivered"),
        (w(status="completed", correlation_key=key), cp(timedOut=True), "slept"),
        (w(status="cancelled"), None, "cancelled"),
    ]
    for record, checkpoint, outcome in cases:
        assert wait_outcome(record, checkpoint, now) == outcome, record
    assert relative_ms(now + 3_599_600, now) == "in 1 h"
    assert relative_ms(now - 90_000, now) == "2 min ago"
    assert relative_ms(now + 400, now) == "now"
    assert relative_ms(now + 2 * 86_400_000, now) == "in 2 d"
    assert describe_ms(None, now) is None
    assert describe_ms(now + 12_000, now) == "2027-01-15T08:00:12Z (in 12 s)"
    finished = Checkpoint(stack_id="s", revision=1, timestamp=now, status="completed")
    assert waiting_for(finished, now) is None
