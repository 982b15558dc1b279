"""The PostgreSQL backend through a PgBouncer in transaction pooling mode.

The fixture starts ``pgbouncer`` on a free loopback port in 30300-30399 in front of the
shared server (``SIGLO_POSTGRES_URL``) and stops it afterwards. In transaction pooling
consecutive transactions of one client may run on different server connections, so
nothing may outlive a transaction: with ``pgbouncer=transaction`` siglo prepares no
statements (PgBouncer before 1.21 does not carry them across: without the option,
``siglo check`` through PgBouncer 1.18 failed 18 of its 45 rules with
``DuplicatePreparedStatement``), and it uses no other session state (no ``SET``, no session advisory
lock: the migration lock is ``pg_advisory_xact_lock``, locks are lease rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _pg_topologies import PgBouncer, free_ports
from _tcp_proxy import TcpProxy
from siglo_check import run_siglo_check
from sql_support import POOL_SIZE, POSTGRES_URL, race, require_postgres

import siglo
from siglo import Checkpoint, InvalidArgumentError, OutcomeUnknownError, WaitRecord
from siglo_postgres import drop_schema, isolated
from siglo_postgres.connect import connect


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    require_postgres()
    parts = urlsplit(POSTGRES_URL)
    server = (
        parts.hostname or "127.0.0.1",
        parts.port or 5432,
        parts.path.strip("/") or "postgres",
        parts.username or "postgres",
    )
    own = PgBouncer(free_ports(30300, 30400, 1)[0], server=server)
    try:
        yield own.start()
    finally:
        own.stop()


@pytest.fixture
async def backend(bouncer: PgBouncer) -> AsyncIterator[siglo.Backend]:
    async with isolated(bouncer.url() + "?pgbouncer=transaction") as through:
        yield through


def test_the_option_turns_prepared_statements_off_and_travels_in_the_url() -> None:
    backend = connect("postgresql://u@h/db?pgbouncer=transaction&schema=s")
    assert backend.adapter.database.prepare_threshold is None  # type: ignore[attr-defined]
    assert "pgbouncer=transaction" in backend.url
    explicit = connect("postgresql://u@h/db?pgbouncer=transaction&prepare_threshold=5")
    assert explicit.adapter.database.prepare_threshold == 5  # type: ignore[attr-defined]
    assert "prepare_threshold=5" in explicit.url  # PgBouncer >= 1.21 can carry them
    assert connect("postgresql://u@h/db").adapter.database.prepare_threshold == 0  # type: ignore[attr-defined]
    for bad in ("statement", "yes"):
        with pytest.raises(InvalidArgumentError, match="pgbouncer must be one of"):
            connect(f"postgresql://u@h/db?pgbouncer={bad}")


async def test_operations_through_one_server_connection(bouncer: PgBouncer) -> None:
    """Every client's transactions interleave on a single server connection."""
    try:
        await _through_one_server_connection(bouncer)
    except BaseException as exc:
        # A CI run once saw the bouncer close a client mid-statement: say why it did.
        exc.add_note(f"pgbouncer's log:\n{bouncer.log_tail()}")
        raise


async def _through_one_server_connection(bouncer: PgBouncer) -> None:
    async with isolated(bouncer.url("one") + "?pgbouncer=transaction") as backend:
        other = siglo.connect(backend.url)
        async with other:
            await backend.adapter.save_checkpoint(Checkpoint(stack_id="s", revision=1, timestamp=1))
            await other.adapter.save_wait_record(WaitRecord(correlation_key="k", stack_id="s"))
            claimed = await backend.adapter.claim_wait_record("k", "c")
            assert claimed is not None
            stored = await other.adapter.get_checkpoint("s")
            assert stored is not None and stored.revision == 1
            assert backend.lock is not None and other.lock is not None
            held = await backend.lock.acquire("L", 5_000)
            assert held.acquired
            assert not (await other.lock.acquire("L", 5_000)).acquired
            # A delete is several statements sent pipelined, ended by one Sync
            # (Database.fetch_all): the bouncer runs them as one transaction.
            assert await other.adapter.delete_checkpoint("s") is True
            assert await backend.adapter.get_checkpoint("s") is None
            assert await backend.adapter.get_wait_record("k") is None


@pytest.mark.contract_sweep
def test_siglo_check_passes_through_pgbouncer(bouncer: PgBouncer, tmp_path: Path) -> None:
    run_siglo_check(bouncer.url() + "?pgbouncer=transaction", tmp_path)


async def test_cas_saves_race_through_pgbouncer(backend: siglo.Backend) -> None:
    rounds = 15
    wins = await race("cas", backend.url, rounds=rounds)
    assert Counter(r for w in wins for r in w) == Counter(range(rounds))
    stored = await backend.adapter.get_checkpoint("race")
    assert stored is not None and stored.revision == rounds


async def test_claims_race_through_pgbouncer(backend: siglo.Backend) -> None:
    keys = [f"k{i}" for i in range(25)]
    for key in keys:
        await backend.adapter.save_wait_record(WaitRecord(correlation_key=key, stack_id="s"))
    won = await race("claims", backend.url, keys=keys)
    assert Counter(k for w in won for k in w) == Counter(keys)


async def test_locks_race_through_pgbouncer(backend: siglo.Backend) -> None:
    keys = [f"k{i}" for i in range(25)]
    won = await race("locks", backend.url, keys=keys)
    acquired = [tuple(x) for w in won for x in w]
    assert Counter(k for k, _ in acquired) == Counter(keys)
    assert all(fence == 1 for _, fence in acquired)


async def test_workflow_lock_race_through_pgbouncer(backend: siglo.Backend) -> None:
    count = 8
    await race("workflow", backend.url, count=count)
    # No lost update: every action read the counter alone.
    assert await backend.adapter.get_cached_step("counter") == POOL_SIZE * count


async def test_concurrent_first_connections_migrate_once(bouncer: PgBouncer) -> None:
    """Six backends connecting to a new schema at once through PgBouncer: one creates
    it, the others find it (before the migration retried, most rounds failed with a
    duplicate schema: see siglo_sql.migrations.migrate)."""
    url = bouncer.url() + "?pgbouncer=transaction"
    for _ in range(5):
        schema = f"siglo_test_{secrets.token_hex(6)}"
        backends = [connect(url, schema=schema) for _ in range(6)]
        try:
            found = await asyncio.gather(*(b.adapter.get_checkpoint("s") for b in backends))
            assert found == [None] * 6
        finally:
            for b in backends:
                await b.aclose()
            await drop_schema(url, schema)


@contextlib.contextmanager
def bouncer_before_a_proxy() -> Iterator[tuple[PgBouncer, TcpProxy]]:
    """A PgBouncer of its own whose server is the shared PostgreSQL behind a TCP proxy
    the test controls (cut, lose a reply); both stopped afterwards."""
    require_postgres()
    parts = urlsplit(POSTGRES_URL)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    server = ("127.0.0.1", proxy.port, parts.path.strip("/") or "postgres", "postgres")
    own = PgBouncer(free_ports(30300, 30400, 1)[0], server=server)
    try:
        yield own.start(), proxy
    finally:
        own.stop()
        proxy.close()


async def test_a_save_whose_reply_pgbouncer_lost_has_an_unknown_outcome() -> None:
    """PgBouncer's server connection lost after the save ran and before its reply: the
    bouncer tells its client ``08P01`` "server conn crashed?", a SQLSTATE, which read as
    the server's own word that the statement did not commit (a plain
    ``StorageAdapterError``), though the save was stored (a black-box auditor). It is
    an unknown outcome; the stored revision says what happened."""
    with bouncer_before_a_proxy() as (own, proxy):
        async with isolated(own.url() + "?pgbouncer=transaction") as backend:
            stack = f"lost-{secrets.token_hex(4)}"
            cp = Checkpoint(stack_id=stack, revision=1, timestamp=1, metadata={"v": 1})
            await backend.adapter.save_checkpoint(cp, expected_revision=0)
            proxy.lose_reply_to(stack.encode())
            with pytest.raises(OutcomeUnknownError):
                await backend.adapter.save_checkpoint(
                    Checkpoint(stack_id=stack, revision=2, timestamp=2, metadata={"v": 2}),
                    expected_revision=1,
                )
            assert proxy.replies_lost == 1
            stored = None
            for _ in range(50):  # the bouncer reconnects to its server
                try:
                    stored = await backend.adapter.get_checkpoint(stack)
                    break
                except siglo.StorageAdapterError:
                    await asyncio.sleep(0.1)
            assert stored is not None and stored.revision == 2  # it had run


async def test_a_write_pgbouncer_could_not_send_is_a_plain_failure() -> None:
    """PgBouncer that cannot reach its server answers ``08P01`` "server login has been
    failing, try again later" at once, the statement sent nowhere: a connection
    exception, but not one with the statement in flight, so a plain
    ``StorageAdapterError`` (as a refused connection is), not an unknown outcome (a
    black-box auditor). The first write after the cut, whose connection the bouncer
    closed as it came, may have gone anywhere: that one is unknown."""
    with bouncer_before_a_proxy() as (own, proxy):
        # The schema made and dropped on the server itself: the bouncer keeps refusing
        # for its server_login_retry (15 s) once the server is back.
        async with isolated(POSTGRES_URL) as direct:
            schema = direct.adapter.schema  # type: ignore[attr-defined]
            # Its tables made here, under the default bound: through the bouncer, at the
            # test's 2 s, the migration's statements were cut off on a loaded machine.
            await direct.adapter.open()  # type: ignore[attr-defined]
            through = f"{own.url()}?pgbouncer=transaction&schema={schema}&command_timeout_ms=2000"
            async with siglo.connect(through) as backend:
                await _claims_refused_while_the_server_is_cut(backend, proxy)


async def _claims_refused_while_the_server_is_cut(backend: siglo.Backend, proxy: TcpProxy) -> None:
    """Nonce claims through the bouncer while its server is cut off: the bouncer's
    "login has been failing" answers are plain failures."""
    nonces = backend.require_nonces()
    assert await nonces.claim(f"before-{secrets.token_hex(4)}", 60)
    proxy.cut()
    refused: list[BaseException] = []
    for attempt in range(4):
        try:
            await nonces.claim(f"cut-{attempt}-{secrets.token_hex(4)}", 60)
        except siglo.StorageAdapterError as exc:
            refused.append(exc)
        await asyncio.sleep(0.3)
    failing = [e for e in refused if "server login has been failing" in str(e)]
    assert failing, [str(e) for e in refused]
    assert not any(isinstance(e, OutcomeUnknownError) for e in failing), failing
    proxy.restore()
