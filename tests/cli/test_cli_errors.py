"""Every bad input to the ``siglo`` command: one ``Error:`` line and a hint, exit status
1, no traceback (issue 13). ``--debug`` shows the traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from siglo.cli import cli

POSTGRES_URL = os.environ.get("SIGLO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("SIGLO_REDIS_URL", "redis://127.0.0.1:6379/0")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, terminal_width=200)


def assert_one_line_error(result: Result, *needles: str) -> str:
    """The failure is shown as users must see it; returns the error line."""
    # 1 for a failure, 2 for click's own usage errors (which print a "Try …" hint).
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    assert any(line.startswith(("Hint: ", "Try '")) for line in lines), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_bad_port() -> None:
    assert_one_line_error(run("check", "redis://127.0.0.1:99999"), "bad port", "65535")
    assert_one_line_error(run("check", "redis://127.0.0.1:port/0"), "bad port")
    assert_one_line_error(run("migrate", "postgresql://127.0.0.1:70000/test"), "bad port")


def test_a_url_with_a_hash() -> None:
    """Refused before anything connects, ``siglo check`` included (it opens a backend
    with the plugin's own factory), and nothing after the scheme shown."""
    for args in (
        ("check", "sqlite:///contract.db#x"),
        ("ls", "postgresql://u:pa#ss@127.0.0.1:5432/test"),
        ("migrate", "redis://:se#cret@127.0.0.1:6379/0"),
    ):
        line = assert_one_line_error(run(*args), "has a `#`", "%23")
        assert "pa" not in line.split("`#`")[0] and "se#" not in line and "ss@" not in line
    # Under settings whose blob store and options go with another URL: refused before
    # the notes that would print this one.
    env = {"SIGLO_URL": "sqlite:///app.db", "SIGLO_BLOB_URL": "memory://"}
    env["SIGLO_OFFLOAD_MIN_BYTES"] = "1024"
    refused = run("ls", "postgresql://u:pa#ss@127.0.0.1:5432/test", env=env)
    assert_one_line_error(refused, "has a `#`")
    assert "note:" not in refused.stderr, refused.stderr


@pytest.mark.parametrize("password", ["pw", "s3cr3t!pw-long-enough"])
def test_click_usage_errors_mask_the_passwords_of_the_urls_they_quote(password: str) -> None:
    """click's own errors quote the argument they refuse: a URL given where a command
    takes none, once too often, to an option of another type, or as a command name.
    Its password is shown as ``***``, as in every other error."""
    pg = f"postgresql://app:{password}@127.0.0.1:5432/test"
    redis = f"redis://:{password}@127.0.0.1:6379/0"
    for args in (
        ("config", pg),
        ("backends", redis),
        ("ls", redis, redis),
        ("ls", "--limit", redis),
        (pg,),
        ("--config", pg, "ls"),
    ):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert password not in result.output, (args, result.output)
        assert ":***@127.0.0.1" in result.output, (args, result.output)
    # A URL given where a path goes: siglo's own error quotes the path, its "//" made "/".
    written = run("export", "memory://", "-o", pg)
    assert written.exit_code == 1, written.output
    assert password not in written.output and ":***@127.0.0.1" in written.output


def test_redis_database_that_is_not_a_number() -> None:
    assert_one_line_error(run("check", f"{REDIS_URL.rsplit('/', 1)[0]}/abc"), "'abc'")


def test_check_refuses_a_url_its_backend_cannot_open_before_its_plan(tmp_path: Path) -> None:
    """A URL the backend's factory refuses (a Redis path that is not a database number,
    an unknown option) is refused before ``siglo check`` prints its plan, for the target
    as for ``--compare``'s, and nothing is created."""
    redis_abc = f"{REDIS_URL.rsplit('/', 1)[0]}/abc"
    bogus = f"sqlite:///{tmp_path / 'c.db'}?bogus=1"
    for args, named in (
        (("check", redis_abc), "'abc'"),
        (("check", bogus), "'bogus'"),
        (("check", "memory://", "--compare", redis_abc), "'abc'"),
    ):
        result = run(*args)
        assert_one_line_error(result, named)
        assert "checks" not in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_redis_on_a_closed_port_is_unreachable_not_a_failed_clean_up() -> None:
    line = assert_one_line_error(
        run("check", f"redis://127.0.0.1:{closed_port()}/0"), "cannot reach"
    )
    assert "removing" not in line


@pytest.mark.parametrize("scheme", ["redis", "postgresql"])
def test_a_server_that_never_answers_is_named_a_timeout(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that accepts and never answers (a hung server, ``rediss://`` to a
    plain Redis): ``siglo check``'s first read ends at its own bound, whose
    ``TimeoutError`` has no text; the error line said "cannot reach the backend at …:"
    and nothing after it (a black-box auditor). It says it had no answer in time."""
    import siglo_contract.runner

    monkeypatch.setattr(siglo_contract.runner, "PROBE_TIMEOUT_S", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        path = "/0" if scheme == "redis" else "/test"
        url = f"{scheme}://127.0.0.1:{port}{path}?command_timeout_ms=60000"
        line = assert_one_line_error(run("check", url), "cannot reach")
    assert line.endswith("no answer within 0.5 s"), line


def test_missing_postgres_database() -> None:
    base = POSTGRES_URL.rsplit("/", 1)[0]
    assert_one_line_error(
        run("check", f"{base}/siglo_no_such_database"), "cannot reach", "does not exist"
    )
    assert_one_line_error(run("migrate", f"{base}/siglo_no_such_database"), "does not exist")


def test_unwritable_sqlite_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "x.db"
    assert_one_line_error(run("check", f"sqlite:///{missing}"), "cannot create")
    assert not (tmp_path / "no").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only directory anyway")
def test_read_only_sqlite_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        assert_one_line_error(run("check", f"sqlite:///{tmp_path / 'x.db'}"), "cannot create")
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.parametrize("url", ["memory://", REDIS_URL])
def test_migrate_a_backend_without_a_schema(url: str) -> None:
    assert_one_line_error(run("migrate", url), "no versioned schema")


def test_migrate_to_a_version_that_does_not_exist(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert_one_line_error(run("migrate", url, "--to", "9"), "no schema version 9")
    assert_one_line_error(run("migrate", url, "--to", "0"))  # click's own range check
    assert not (tmp_path / "m.db").exists()


def test_migrate_down_says_migrations_only_go_forward(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    done = run("migrate", url)
    assert done.exit_code == 0, done.output
    line = assert_one_line_error(run("migrate", url, "--to", "1"), "only go forward")
    assert "newer" not in line


def test_migrate_status_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "status.db"
    done = run("migrate", f"sqlite:///{path}", "--status")
    assert done.exit_code == 0, done.output
    assert "schema version 0" in done.output
    assert not path.exists()


def test_unwritable_junit_xml_is_refused_before_the_run(tmp_path: Path) -> None:
    report = tmp_path / "missing-dir" / "report.xml"
    result = run("check", "memory://", "--junit-xml", str(report))
    assert_one_line_error(result, "JUnit XML")
    assert "checks" not in result.stderr  # refused before the suite started


@pytest.mark.parametrize("args", [("check", ""), ("migrate", ""), ("check", "   ")])
def test_empty_url_is_an_error_not_the_default(args: tuple[str, ...]) -> None:
    assert_one_line_error(run(*args), "empty")


def test_empty_siglo_url_is_an_error() -> None:
    assert_one_line_error(run("check", env={"SIGLO_URL": ""}), "$SIGLO_URL is empty")


def test_not_a_url() -> None:
    assert_one_line_error(run("check", "siglo.db"), "not a backend URL")
    assert_one_line_error(run("migrate", "nosuch://x"), "nosuch://")


def test_no_rule_matches() -> None:
    assert_one_line_error(run("check", "memory://", "--rule", "no.such.rule"), "no rule")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run("--debug", "migrate", "memory://")
    # CliError is the one-line form even with --debug; an unexpected error is re-raised.
    assert result.exit_code == 1
    url = f"sqlite:///{tmp_path / 'm.db'}"
    debug = run("--debug", "migrate", url, "--to", "9")
    assert debug.exit_code == 1
    assert debug.exception is not None and not isinstance(debug.exception, SystemExit)


def test_the_real_entry_point_prints_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "siglo", "migrate", "redis://127.0.0.1:99999"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Error: bad port"), done.stderr
    assert "Traceback" not in done.stderr
    traced = subprocess.run(
        [sys.executable, "-m", "siglo", "--debug", "migrate", "redis://127.0.0.1:99999"],
        capture_output=True,
        text=True,
    )
    assert traced.returncode == 1
    assert "Traceback" in traced.stderr


def test_bad_input_found_from_outside_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values an outside audit found reported as an internal error or an outage, or
    accepted when they would do something else than meant: each is a one-line error
    naming what is wrong, and nothing is stored."""
    db = tmp_path / "a.db"
    url = f"sqlite:///{db}"
    assert run("migrate", url).exit_code == 0
    cases = [
        (("export", url, "-n", "bad\udcffname", "-o", str(tmp_path / "d")), "namespace"),
        (("ls", "redis://127.0.0.1:6379/0?socket_timeout=abc"), "socket_timeout"),
        (("rm", url, "run-1", "--revision", str(2**70)), "--revision"),
        (("ls", f"{url}?table_prefix=a_&table_prefix=b_"), "given twice"),
        (("import", "sqlite://"), "private to this command"),
        (("drill", url, "--duration", "nan"), "not a finite number"),
        (("worker", url, "--flows", "badflows:f", "--retry-for", "nan"), "not a finite number"),
        (("worker", url, "--flows", "badflows:f", "--interval", "inf"), "not a finite number"),
        (("worker", url, "--flows", "badflows:f", "--once"), "SyntaxError"),
    ]
    (tmp_path / "badflows.py").write_text("def broken(:\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # the flows' module is imported from the current directory
    for args, named in cases:
        result = run(*args)
        assert result.exit_code != 0, (args, result.output)
        assert named in result.output, (args, result.output)
        assert "unexpected" not in result.output and "Traceback" not in result.output
    keys = "k1=" + "A" * 43 + "=,k1=" + "B" * 43 + "="
    twice = run("config", env={"SIGLO_ENCRYPTION_KEYS": keys})
    assert twice.exit_code != 0 and "key id 'k1' twice" in twice.output, twice.output
    listed = run("ls", url, "--json")
    assert listed.exit_code == 0 and '"items": []' in listed.stdout
