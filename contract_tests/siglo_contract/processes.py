"""The worker processes of the cross-process checks: ``python -m siglo_contract.workers``.

Started once per run and reused by every cross-process check. They are plain
subprocesses of the interpreter running the suite, given its ``sys.path``: unlike
``multiprocessing``'s spawn they never import the caller's ``__main__``, so the suite
runs from any script, guarded by ``if __name__ == "__main__"`` or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from typing import IO, Any

import orjson

__all__ = ["WorkerProcesses"]


def _environment() -> dict[str, str]:
    """The caller's environment, with its ``sys.path`` as the workers' ``PYTHONPATH``: a
    suite imported from a source tree is imported from there by the workers too."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


class WorkerProcesses:
    """A fixed number of worker processes, each answering one request at a time."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._procs: list[asyncio.subprocess.Process] = []
        self._errors: list[IO[bytes]] = []

    async def start(self) -> None:
        """Start the processes (they import siglo and the backends while the caller goes on)."""
        env = _environment()
        for _ in range(self.count):
            # Kept open until close(): a dead worker's last words, for the error.
            errors = tempfile.TemporaryFile()  # noqa: SIM115
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "siglo_contract.workers",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
                env=env,
            )
            self._procs.append(proc)
            self._errors.append(errors)

    async def run(self, requests: list[dict[str, Any]]) -> list[Any]:
        """Each request on a process of its own (in turns when there are more requests
        than processes), all at once; their results in order. A request that raised in
        its worker raises :class:`RuntimeError` here with the worker's traceback."""
        if not self._procs:
            await self.start()

        async def serve(index: int) -> list[tuple[int, Any]]:
            proc = self._procs[index]
            assert proc.stdin is not None and proc.stdout is not None
            answers = []
            for number in range(index, len(requests), self.count):
                proc.stdin.write(orjson.dumps(requests[number]) + b"\n")
                await proc.stdin.drain()
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"a contract worker process died: {self._stderr(index)}")
                answer = orjson.loads(line)
                if "error" in answer:
                    raise RuntimeError(f"a contract worker failed: {answer['error']}")
                answers.append((number, answer["result"]))
            return answers

        done = await asyncio.gather(*(serve(i) for i in range(min(self.count, len(requests)))))
        return [result for _, result in sorted(pair for part in done for pair in part)]

    def _stderr(self, index: int) -> str:
        errors = self._errors[index]
        errors.seek(0)
        return errors.read()[-4000:].decode(errors="replace") or "(no output)"

    async def close(self) -> None:
        """Stop the processes (closing their input ends them; a stuck one is killed)."""
        for proc in self._procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self._procs:
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for errors in self._errors:
            errors.close()
        self._procs.clear()
        self._errors.clear()
