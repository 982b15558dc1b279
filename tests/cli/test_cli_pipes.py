"""A command whose reader goes away (``siglo ls | head``) stops quietly: no ``Error:``
line blaming a path, as any command in a pipe (exit status 1, click's)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import siglo


@pytest.mark.parametrize("command", [["ls", "--limit", "2000"], ["export"]])
def test_a_closed_pipe_stops_the_command_quietly(tmp_path: Path, command: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'many.db'}"

    async def fill() -> None:
        async with siglo.connect(url) as backend:
            manager = siglo.StorageManager(backend)
            for i in range(2000):
                stack = manager.create_stack(f"stack-{i}", metadata={"pad": "x" * 200})
                await stack.save()
                manager.discard_stack(stack)

    asyncio.run(fill())
    reader = subprocess.Popen(
        [sys.executable, "-m", "siglo", command[0], url, *command[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.readline()  # the reader takes a line, then goes away
    reader.stdout.close()
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 1
    assert "Error" not in err and "Hint" not in err and "Traceback" not in err, err
