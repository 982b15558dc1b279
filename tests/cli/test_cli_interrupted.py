"""Every command that works on a store, stopped by Ctrl-C, SIGTERM or SIGHUP, says it was
interrupted and what to do, and exits with 128 + the signal's number — as export, import,
rekey and erase do (the others ended with click's bare "Aborted!" and status 1, or
silently on SIGTERM). Each command here waits on a Redis server behind a frozen proxy
when the signal comes: a real process, a real signal."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from _redis_helpers import REDIS_URL, require_redis
from _tcp_proxy import proxied_url
from stopped_commands import stopped_while_waiting

from siglo_redis import isolated

COMMANDS = {
    "ls": ["ls", "{url}"],
    "show": ["show", "{url}", "run-1"],
    "rm": ["rm", "{url}", "run-1"],
    "clean": ["clean", "{url}"],
    "prune": ["prune", "{url}", "--older-than", "1d", "--dry-run"],
    "collect-blobs": ["collect-blobs"],  # the settings' store (below)
}


@pytest.mark.parametrize(
    ("command", "stop"),
    [(name, "SIGTERM") for name in COMMANDS] + [("ls", "SIGINT"), ("clean", "SIGHUP")],
)
async def test_a_stopped_command_says_it_was_interrupted(
    tmp_path: Path, command: str, stop: str
) -> None:
    require_redis()
    signum = signal.Signals[stop]
    async with isolated(REDIS_URL) as store:
        with proxied_url(store.url, 6379) as (url, proxy):
            args = [a.format(url=url) for a in COMMANDS[command]]
            # collect-blobs collects the settings' blob store, on the same server.
            env = {"SIGLO_URL": url, "SIGLO_BLOB_URL": url}
            status, said = await stopped_while_waiting(args, proxy, tmp_path, signum, env)
    assert status == 128 + signum, (status, said)
    assert f"siglo {command} was interrupted ({stop})" in said, said
    assert "run it again" in said, said


async def test_a_stopped_migration_says_it_was_interrupted(tmp_path: Path) -> None:
    """``siglo migrate`` waiting on a PostgreSQL server behind a frozen proxy."""
    from sql_support import POSTGRES_URL, require_postgres

    require_postgres()
    with proxied_url(POSTGRES_URL, 5432) as (url, proxy):
        args = ["migrate", url, "--status"]
        status, said = await stopped_while_waiting(args, proxy, tmp_path, signal.SIGTERM)
    assert status == 128 + signal.SIGTERM, (status, said)
    assert "siglo migrate was interrupted (SIGTERM)" in said, said
    assert "run it again" in said, said
