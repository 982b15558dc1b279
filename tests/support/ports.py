"""Loopback ports for servers a test starts itself, safe across concurrent test processes.

Several processes pick ports at once (pytest-xdist workers, another checkout's run on the
same machine), so a port that is free now may be taken by the time a server binds it.
Each pick is made under an exclusive lock on one file in the temporary directory, which
also records the ports handed out in the last few minutes: no two processes get the same
port while a server may still be starting on it. The scan starts at a random offset, so
concurrent runs spread over the range.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from pathlib import Path

__all__ = ["free_port", "free_ports"]

_LEDGER = Path(tempfile.gettempdir()) / "siglo-test-ports"
_HELD_S = 300.0
"""How long a port handed out stays reserved for the process that got it (or until that
process ends)."""


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def free_ports(low: int, high: int, count: int = 1) -> list[int]:
    """``count`` loopback ports in ``[low, high)`` that nobody listens on and no other
    process was given in the last :data:`_HELD_S` seconds."""
    with open(_LEDGER, "a+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.seek(0)
        now = time.time()
        held: dict[int, tuple[float, int]] = {}
        for line in ledger.read().split():
            port_text, _, rest = line.partition("@")
            at_text, _, pid_text = rest.partition("@")
            with contextlib.suppress(ValueError):
                pid = int(pid_text) if pid_text else 0
                if now - float(at_text) < _HELD_S and _alive(pid):
                    held[int(port_text)] = (float(at_text), pid)
        span = list(range(low, high))
        start = random.randrange(len(span))
        found: list[int] = []
        for port in span[start:] + span[:start]:
            if port not in held and not _listening(port):
                found.append(port)
                if len(found) == count:
                    break
        else:
            raise RuntimeError(f"not {count} free ports in {low}-{high}")
        held.update(dict.fromkeys(found, (now, os.getpid())))
        ledger.seek(0)
        ledger.truncate()
        ledger.write(" ".join(f"{p}@{at}@{pid}" for p, (at, pid) in held.items()))
        return found


def _alive(pid: int) -> bool:
    """Whether the process that took a port still runs (``0``: an entry that does not say,
    held for the whole time). A port is freed with its process: back to back runs of a
    module whose range is ten ports wide found none free for five minutes."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port(low: int, high: int) -> int:
    """A loopback port in ``[low, high)`` (see :func:`free_ports`)."""
    return free_ports(low, high)[0]
