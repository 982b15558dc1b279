"""The suite runs from any script (issue 30): the docs' example, a plain script without a
``__main__`` guard, on backends whose checks start other processes — a SQLite file and
PostgreSQL. (With ``multiprocessing``'s spawn, its workers re-ran such a script and
``checkpoint.occ.atomic`` failed with ``BrokenProcessPool``.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sql_support import POSTGRES_URL, require_postgres

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "running-the-contract-suite.md"


def _docs_example() -> str:
    """The "From Python" block of docs/running-the-contract-suite.md."""
    section = PAGE.read_text().split("## From Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


@pytest.mark.rule("checkpoint.occ.atomic")
@pytest.mark.parametrize("kind", ["sqlite-file", "postgres"])
def test_the_docs_example_runs_from_a_script_without_a_guard(kind: str, tmp_path: Path) -> None:
    code = _docs_example()
    assert "__main__" not in code
    if kind == "postgres":
        require_postgres()
        code = code.replace("sqlite:///contract-check.db", POSTGRES_URL)
    script = tmp_path / "check_my_store.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("pass")
    assert "BrokenProcessPool" not in done.stderr
    assert (tmp_path / "contract.xml").read_text().count("<failure") == 0
    # Nothing else is left where it ran: no SQLite file, no ./.hypothesis.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check_my_store.py", "contract.xml"]
