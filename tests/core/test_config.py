"""The one configuration (SPEC §4 "One configuration, every path"): where settings are read
from, in which order, what a bad one says, and that connect(), the manager, the
synchronous facade and the command line take them from there."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from settings_support import clean_settings  # noqa: F401  (autouse: a clean slate)

import siglo
from siglo import sync
from siglo.cli import cli
from siglo.config import (
    CONFIG_ENV,
    Settings,
    configure,
    current_settings,
    load_settings,
    reset_settings,
)
from siglo.errors import InvalidArgumentError
from siglo.redaction import REDACT_FIELDS_KEY, REDACTED


def test_defaults_without_file_or_environment() -> None:
    settings = load_settings()
    assert settings == Settings(source="defaults")
    assert settings.redact_fields == frozenset()
    assert settings.error_mode is None
    assert settings.namespace_fallback is True
    assert settings.command_timeout_ms == 10_000


def test_siglo_toml_then_environment_then_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "siglo.toml").write_text(
        'url = "sqlite:///from-file.db"\n'
        'redact_fields = ["card"]\n'
        'error_mode = "warn"\n'
        "command_timeout_ms = 2500\n"
        "[options]\n"
        "busy_timeout_ms = 1234\n"
    )
    from_file = load_settings()
    assert from_file.url == "sqlite:///from-file.db"
    assert from_file.error_mode == "warn"
    assert from_file.command_timeout_ms == 2500
    assert dict(from_file.options) == {"busy_timeout_ms": 1234}
    assert from_file.source == str(tmp_path / "siglo.toml")

    monkeypatch.setenv("SIGLO_ERROR_MODE", "strict")
    monkeypatch.setenv("SIGLO_REDACT_FIELDS", "cvv, pin")
    monkeypatch.setenv("SIGLO_NAMESPACE_FALLBACK", "false")
    monkeypatch.setenv("SIGLO_COMMAND_TIMEOUT_MS", "none")
    layered = load_settings(error_mode="best-effort", redact_fields=["token"])
    assert layered.error_mode == "best-effort"  # arguments win
    assert layered.namespace_fallback is False  # the environment wins over the default
    assert layered.command_timeout_ms is None  # and over the file
    assert layered.url == "sqlite:///from-file.db"  # the file, where nothing else spoke
    # Redacted keys accumulate: no later source can expose what an earlier one protects.
    assert layered.redact_fields == {"card", "cvv", "pin", "token"}
    assert "environment" in layered.source and "arguments" in layered.source


def test_pyproject_tool_siglo_found_from_a_subdirectory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.siglo]\nredact_fields = ["password"]\n'
    )
    deep = tmp_path / "src" / "app"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert load_settings().redact_fields == {"password"}


def test_a_pyproject_without_tool_siglo_does_not_stop_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "siglo.toml").write_text('redact_fields = ["outer"]\n')
    inner = tmp_path / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "pkg"\n')
    monkeypatch.chdir(inner)
    assert load_settings().redact_fields == {"outer"}


def test_siglo_config_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "siglo.toml").write_text('redact_fields = ["here"]\n')
    elsewhere = tmp_path / "deploy.toml"
    elsewhere.write_text('redact_fields = ["there"]\n')
    monkeypatch.setenv(CONFIG_ENV, str(elsewhere))
    assert load_settings().redact_fields == {"there"}
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.toml"))
    with pytest.raises(InvalidArgumentError, match="SIGLO_CONFIG"):
        load_settings()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('redact_feilds = ["card"]\n', r"unknown setting\(s\) 'redact_feilds'.*known: "),
        ('error_mode = "loud"\n', r"error_mode must be one of .*siglo\.toml"),
        ('redact_fields = "card"\n', r"redact_fields .* must be a list"),
        ("command_timeout_ms = -5\n", r"command_timeout_ms must be a positive integer"),
        ("namespace_fallback = 1\n", r"namespace_fallback must be true or false"),
        ("this is not toml", r"cannot read siglo settings"),
    ],
)
def test_a_bad_settings_file_is_refused_naming_what_and_where(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "siglo.toml").write_text(content)
    with pytest.raises(InvalidArgumentError, match=message):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SIGLO_ERROR_MODE", "loud", r"error_mode must be one of .*\(\$SIGLO_ERROR_MODE\)"),
        ("SIGLO_MAX_DOCUMENT_BYTES", "-5", r"got -5 \(\$SIGLO_MAX_DOCUMENT_BYTES\)"),
        ("SIGLO_NAMESPACE_FALLBACK", "maybe", "SIGLO_NAMESPACE_FALLBACK must be true or false"),
        ("SIGLO_COMMAND_TIMEOUT_MS", "soon", "SIGLO_COMMAND_TIMEOUT_MS must be an integer"),
    ],
)
def test_a_bad_variable_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidArgumentError, match=message):
        load_settings()


def test_unknown_argument_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        InvalidArgumentError,
        match="known: blind_index_fields, blob_grace_ms, blob_url, command_timeout_ms",
    ):
        load_settings(redact="card")


def test_repr_and_describe_mask_the_password() -> None:
    settings = Settings(url="postgresql://app:s3cret@db/app", options={"sslpassword": "k3y"})
    assert "s3cret" not in repr(settings) and "k3y" not in repr(settings)
    assert settings.describe()["url"] == "postgresql://app:***@db/app"
    # Every option whose value is kept out of errors is masked in what is shown too.
    options = {"passwd": "hunter22", "pass": "p4ss", "credential_provider": "vault:x"}
    shown = Settings(options={**options, "max_connections": 5}).describe()["options"]
    assert shown == {**dict.fromkeys(options, "***"), "max_connections": 5}


def test_current_settings_follow_the_environment_and_configure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert current_settings().url is None
    monkeypatch.setenv("SIGLO_URL", "memory://")
    assert current_settings().url == "memory://"  # read again: the variable changed
    configured = configure(redact_fields=["card"])
    assert current_settings() is configured
    assert configured.url == "memory://"  # configure() layers on the file and environment
    reset_settings()
    assert current_settings().redact_fields == frozenset()


async def test_connect_takes_url_options_and_timeout_from_the_settings(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    settings = Settings(url=f"sqlite:///{db}", command_timeout_ms=1234)
    async with siglo.connect(settings=settings) as backend:
        assert backend.name == "sqlite"
        assert backend.raw_adapter.database.command_timeout_ms == 1234
    # A URL's own bound wins over the settings'.
    async with siglo.connect(f"sqlite:///{db}?command_timeout_ms=99", settings=settings) as b:
        assert b.raw_adapter.database.command_timeout_ms == 99
    # Backend options of the settings belong to the settings' URL only.
    other = Settings(url="redis://127.0.0.1:1/0", options={"prefix": "x:"})
    async with siglo.connect(f"sqlite:///{db}", settings=other) as backend:
        assert backend.name == "sqlite"


def test_connect_without_any_url_says_where_to_set_one() -> None:
    with pytest.raises(InvalidArgumentError, match=r"SIGLO_URL, or set url in siglo\.toml"):
        siglo.connect()


async def test_a_connected_backend_redacts_whatever_path_writes(tmp_path: Path) -> None:
    settings = Settings(redact_fields=frozenset({"card"}))
    async with siglo.connect(f"sqlite:///{tmp_path / 'p.db'}", settings=settings) as backend:
        # The adapter itself, as an import or a user's own code calls it.
        await backend.adapter.save_checkpoint(
            siglo.Checkpoint(
                stack_id="s",
                revision=1,
                timestamp=1,
                contexts={"pay": {"card": "4111", "amount": 5}},
                metadata={"input": {"card": "4111"}},
            )
        )
        stored = await backend.raw_adapter.get_checkpoint("s")
        assert stored is not None
        assert stored.contexts == {"pay": {"card": REDACTED, "amount": 5}}
        assert stored.metadata == {"input": {"card": REDACTED}, REDACT_FIELDS_KEY: ["card"]}
        assert backend.idempotency is not None
        await backend.idempotency.claim("k")
        await backend.idempotency.complete("k", {"card": "4111"})
        assert await backend.idempotency.get_result("k") == {"card": REDACTED}
        await backend.adapter.set_cached_step("c", [{"card": "4111"}])
        assert await backend.adapter.get_cached_step("c") == [{"card": REDACTED}]


async def test_without_a_stage_connect_returns_the_backend_as_it_is() -> None:
    async with siglo.connect("memory://", settings=Settings()) as backend:
        assert backend.adapter is backend.raw_adapter


async def test_the_manager_follows_the_settings_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIGLO_ERROR_MODE", "warn")
    monkeypatch.setenv("SIGLO_REDACT_FIELDS", "card")
    monkeypatch.setenv("SIGLO_NAMESPACE_FALLBACK", "false")
    async with siglo.connect("memory://") as backend:
        manager = siglo.StorageManager(backend)
        assert manager.error_mode == "warn"
        assert manager.redact_fields == {"card"}
        assert manager.namespace_fallback is False
        explicit = siglo.StorageManager(
            backend, error_mode="strict", redact_fields=["pin"], namespace_fallback=True
        )
        assert explicit.error_mode == "strict"
        assert explicit.redact_fields == {"card", "pin"}  # added to, never instead of
        assert explicit.namespace_fallback is True
        given = siglo.StorageManager(backend, settings=Settings(redact_fields=frozenset({"x"})))
        # Settings given are complete but for redaction: the environment's key stays.
        assert given.redact_fields == {"card", "x"}
        assert given.error_mode == "best-effort"  # memory://'s safe default


async def test_a_restored_stack_keeps_redacting_what_its_writer_redacted() -> None:
    """A process whose own settings name no redaction (a worker started without the
    application's settings) still redacts the keys a checkpoint says were redacted."""
    async with siglo.connect("memory://") as backend:
        writer = siglo.StorageManager(backend, redact_fields=["card"])
        stack = writer.create_stack("order")
        stack.set("pay", "card", "4111")
        await stack.save()
        reader = siglo.StorageManager(backend)
        assert reader.redact_fields == frozenset()
        resumed = await reader.resume("order")
        assert resumed is not None and resumed.redact_fields == {"card"}
        resumed.set("pay", "card", "5500")
        resumed.set("retry", "payload", {"card": "5500"})
        saved = await resumed.save()
        assert saved.contexts == {
            "pay": {"card": REDACTED},
            "retry": {"payload": {"card": REDACTED}},
        }


def test_the_sync_manager_takes_settings_and_redact_fields() -> None:
    with sync.connect("memory://") as backend:
        manager = sync.StorageManager(backend, redact_fields=["card"])
        assert manager.redact_fields == {"card"}
        stack = manager.create_stack("s")
        stack.set("pay", "card", "4111")
        saved = stack.save()
        assert saved.contexts == {"pay": {"card": REDACTED}}
        configured = sync.StorageManager(
            backend, settings=Settings(redact_fields=frozenset({"pin"}))
        )
        assert configured.settings.redact_fields == {"pin"}


async def test_settings_built_in_code_still_redact_what_the_file_and_environment_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Settings(max_document_bytes=…)`` (as docs/large-state.md builds them) is complete
    for every other setting, but it does not drop a key the file or the environment
    redacts — through connect(), the manager, the synchronous facade or configure()."""
    (tmp_path / "siglo.toml").write_text('redact_fields = ["card"]\n')
    monkeypatch.setenv("SIGLO_REDACT_FIELDS", "cvv")
    built = Settings(max_document_bytes=4_096, redact_fields=frozenset({"pin"}))

    async def stored(backend: siglo.Backend, manager: siglo.StorageManager) -> object:
        stack = manager.create_stack("order-7")
        for key in ("card", "cvv", "pin", "amount"):
            stack.set("pay", key, "4111" if key != "amount" else 12)
        await stack.save()
        saved = await backend.raw_adapter.get_checkpoint("order-7")
        assert saved is not None
        return saved.contexts["pay"]

    hidden = {"card": REDACTED, "cvv": REDACTED, "pin": REDACTED, "amount": 12}
    async with siglo.connect("memory://", settings=built) as backend:
        assert await stored(backend, siglo.StorageManager(backend)) == hidden
    async with siglo.connect("memory://") as backend:
        # A backend of the process's settings, a manager given the built ones.
        manager = siglo.StorageManager(backend, settings=built)
        assert manager.settings.redact_fields == {"card", "cvv", "pin"}
        assert manager.settings.max_document_bytes == 4_096
    with sync.connect("memory://", settings=built) as sync_backend:
        facade = sync.StorageManager(sync_backend, settings=built)
        assert facade.settings.redact_fields == {"card", "cvv", "pin"}
    installed = configure(built)
    assert installed.redact_fields == {"card", "cvv", "pin"}
    # Where they came from says so (siglo worker prints it at start).
    assert installed.source == (
        f"defaults + redact_fields of {tmp_path / 'siglo.toml'} + environment"
    ), installed.source
    assert installed.max_document_bytes == 4_096
    async with siglo.connect("memory://") as backend:
        assert await stored(backend, siglo.StorageManager(backend)) == hidden


def test_the_command_line_shows_and_uses_the_settings(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    (tmp_path / "siglo.toml").write_text(f'url = "sqlite:///{db}"\nredact_fields = ["card"]\n')
    runner = CliRunner()
    shown = runner.invoke(cli, ["config", "--json"])
    assert shown.exit_code == 0, shown.output
    assert '"card"' in shown.output and str(db) in shown.output
    made = runner.invoke(cli, ["migrate"])  # no URL: the settings' URL (ls creates nothing)
    assert made.exit_code == 0, made.output
    listed = runner.invoke(cli, ["ls"])
    assert listed.exit_code == 0, listed.output
    assert "0 stack(s)" in listed.output
    other = tmp_path / "other.toml"
    other.write_text('error_mode = "loud"\n')
    bad = runner.invoke(cli, ["--config", str(other), "config"])
    assert bad.exit_code == 1
    assert "Error: error_mode must be one of" in bad.output
    assert os.environ.get(CONFIG_ENV) == str(other)  # for the rest of the process


def test_options_without_a_url_go_with_the_url_a_command_names(tmp_path: Path) -> None:
    """A ``siglo.toml`` with ``[options]`` and no ``url``: a command given a URL (``siglo
    migrate URL``) opens it with those options — before, they were dropped silently, and
    ``schema=``/``prefix=`` named nothing (the store's default schema was migrated), while
    ``siglo config`` showed them. Options that name a URL of their own go with it alone,
    and a command given another URL says so."""
    import sqlite3
    import subprocess
    import sys

    def siglo_cli(*args: str) -> subprocess.CompletedProcess[str]:
        # A process per command, as in a shell: each reads the settings file afresh.
        return subprocess.run(
            [sys.executable, "-m", "siglo", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def tables(path: Path) -> set[str]:
        with sqlite3.connect(path) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master")}

    (tmp_path / "siglo.toml").write_text('[options]\ntable_prefix = "appa_"\n')
    url = f"sqlite:///{tmp_path / 'app.db'}"
    done = siglo_cli("migrate", url)
    assert done.returncode == 0, done.stderr
    assert "appa_checkpoints" in tables(tmp_path / "app.db")
    (tmp_path / "siglo.toml").write_text('[options]\ntable_prfix = "appa_"\n')  # a typo
    typo = siglo_cli("migrate", url)
    assert typo.returncode == 1 and "table_prfix" in typo.stderr, typo.stderr
    assert "from the [options] of" in typo.stderr and "siglo.toml" in typo.stderr
    # A parameter the URL's query gives itself wins over the file's.
    (tmp_path / "siglo.toml").write_text('[options]\ntable_prefix = "appa_"\n')
    own = siglo_cli("migrate", f"{url}?table_prefix=appc_")
    assert own.returncode == 0, own.stderr
    assert "appc_checkpoints" in tables(tmp_path / "app.db")
    (tmp_path / "siglo.toml").write_text(
        f'url = "sqlite:///{tmp_path / "other.db"}"\n[options]\ntable_prefix = "appb_"\n'
    )
    noted = siglo_cli("migrate", url)
    assert noted.returncode == 0, noted.stderr
    assert "go with its url" in noted.stderr and "table_prefix=…" in noted.stderr
    assert not any(name.startswith("appb_") for name in tables(tmp_path / "app.db"))


def test_a_urls_own_query_wins_over_the_files_options_whatever_the_source(
    tmp_path: Path,
) -> None:
    """``$SIGLO_URL``'s ``?table_prefix=`` (or the file's own url's) was overridden by
    the file's ``[options]``, a source it outranks, so the application and every command
    opened other tables than the URL named; Redis's ``key_prefix`` option beat a URL's
    ``?prefix=``; and a settings URL with a trailing newline (a secret file) made the
    commands, which strip it, drop the options (a black-box auditor)."""
    import sqlite3

    def tables(path: Path) -> set[str]:
        with sqlite3.connect(path) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master")}

    db = tmp_path / "q.db"
    (tmp_path / "siglo.toml").write_text('[options]\ntable_prefix = "opttp_"\n')
    environ = {"SIGLO_URL": f"sqlite:///{db}?table_prefix=envtp_"}
    settings = load_settings(start=tmp_path, environ=environ)
    backend = siglo.connect(settings=settings)
    assert "table_prefix=envtp_" in backend.url
    asyncio.run(backend.aclose())
    # The file's own url and [options] at once: the query wins there too.
    (tmp_path / "siglo.toml").write_text(
        f'url = "sqlite:///{db}?table_prefix=urltp_"\n[options]\ntable_prefix = "opttp_"\n'
    )
    done = CliRunner().invoke(cli, ["migrate"], env={"SIGLO_CONFIG": str(tmp_path / "siglo.toml")})
    assert done.exit_code == 0, done.output
    assert "urltp_checkpoints" in tables(db) and "opttp_checkpoints" not in tables(db)
    # Redis: the option's other name loses to the query as well.
    redis_settings = Settings(options={"key_prefix": "file-prefix:"})
    redis_backend = siglo.connect(
        "redis://127.0.0.1:6379/0?prefix=url-prefix:", settings=redis_settings
    )
    assert "prefix=url-prefix:" in redis_backend.url
    # Spaces around the settings' URL are not part of it.
    spaced = load_settings(start=tmp_path, environ={"SIGLO_URL": f"sqlite:///{db}\n"})
    assert spaced.url == f"sqlite:///{db}"


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("SIGLO_ENCRYPTION_KEY", "SIGLO_ENCRYPTION_KEYS"),
        ("SIGLO_MAX_DOCUMENT_BYTE", "SIGLO_MAX_DOCUMENT_BYTES"),
        ("SIGLO_REQUIRE_ENCRYPT", "SIGLO_REQUIRE_ENCRYPTION"),
        ("SIGLO_BLOBURL", "SIGLO_BLOB_URL"),
        ("SIGLO_CONFG", "SIGLO_CONFIG"),
        ("SIGLO_UI_TOKN", "SIGLO_UI_TOKEN"),
        ("SIGLO_encryption_keys", "SIGLO_ENCRYPTION_KEYS"),
        # One letter changed or two swapped in a short name (they passed unread).
        ("SIGLO_CONIFG", "SIGLO_CONFIG"),
        ("SIGLO_CONFIF", "SIGLO_CONFIG"),
        ("SIGLO_UI_TOEKN", "SIGLO_UI_TOKEN"),
        ("SIGLO_UI_TOKEM", "SIGLO_UI_TOKEN"),
        ("SIGLO_BLOB_URI", "SIGLO_BLOB_URL"),
        ("SIGLO_URI", "SIGLO_URL"),
    ],
)
def test_a_misspelt_setting_variable_is_refused_naming_the_one_meant(
    variable: str, meant: str, tmp_path: Path
) -> None:
    """A misspelt ``SIGLO_*`` variable was not read and said nothing: with
    ``SIGLO_ENCRYPTION_KEY`` (no S) a store was written in clear (a black-box auditor).
    One a letter or so from a setting's is refused, by the library and by every command;
    the other ``SIGLO_*`` names an application or the test suite uses pass."""
    with pytest.raises(InvalidArgumentError, match=rf"\${variable} is not a variable siglo"):
        load_settings(start=tmp_path, environ={variable: "x"})
    done = CliRunner().invoke(cli, ["config"], env={variable: "x"})
    assert done.exit_code == 1 and f"did you mean ${meant}?" in done.output, done.output
    others = {
        name: "x"
        for name in (
            "SIGLO_PG_URL",
            "SIGLO_REDIS_URL",
            "SIGLO_POSTGRES_URL",
            "SIGLO_TEST_MARKS",
            "SIGLO_UI_TOKEN",
            "SIGLO_DEBUG",
            "SIGLO_DISABLE_PLUGINS",
            "SIGLO_APP_REGION",
        )
    }
    assert load_settings(start=tmp_path, environ=others).url is None


def test_the_siglo_config_sample_of_the_docs_is_what_it_prints(tmp_path: Path) -> None:
    """docs/configuration.md shows `siglo config` for a siglo.toml and one variable:
    its rows and its last line are what the command prints (they had drifted by seven
    settings, a black-box auditor)."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    sample = page.split("```text\n$ siglo config\n", 1)[1].split("```", 1)[0]
    (tmp_path / "siglo.toml").write_text(
        'url = "sqlite:///app.db"\nredact_fields = ["card", "cvv"]\nerror_mode = "strict"\n'
        "namespace_fallback = false\ncommand_timeout_ms = 5000\n\n"
        "[options]\nbusy_timeout_ms = 2000\n"
    )
    env: dict[str, str | None] = {
        name: None for name in os.environ if name.startswith("SIGLO_")
    }  # unset: none of this process's own
    env.update(SIGLO_CONFIG=str(tmp_path / "siglo.toml"), SIGLO_REDACT_FIELDS="cvv")
    done = CliRunner().invoke(cli, ["config"], env={**env, "COLUMNS": "100"})
    assert done.exit_code == 0, done.output

    def rows(text: str) -> list[list[str]]:
        return [
            [cell.strip() for cell in line.strip("│").split("│")]
            for line in text.splitlines()
            if line.startswith("│")
        ]

    assert rows(sample) == rows(done.output), done.output
    last = [line for line in sample.splitlines() if line.strip()][-1]
    assert last.startswith("environment variables read:")
    assert last in done.output
    assert re.search(r"siglo settings \(from .*siglo\.toml", done.output.replace("\n", " "))


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis", "postgres"])
async def test_text_options_in_the_settings_file_read_as_in_a_url(
    kind: str, tmp_path: Path
) -> None:
    """TOML has no null: ``checkpoint_ttl_ms = "none"`` in a settings file's
    ``[options]`` was refused where ``?checkpoint_ttl_ms=none`` in the URL was taken
    (the encryption page tells Redis stores with envelope keys to set it; a black-box
    auditor). A text option reads as the URL's query reads it; ``"false"`` is false,
    not the truth of a non-empty string; a value that does not read is refused, naming
    the option and the file."""
    from _redis_helpers import REDIS_URL, require_redis
    from sql_support import POSTGRES_URL, require_postgres

    if kind == "redis":
        require_redis()
    elif kind == "postgres":
        require_postgres()
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path}/app.db",
        "redis": REDIS_URL,
        "postgres": POSTGRES_URL,
    }
    extra = {"redis": 'auto_pipeline = "false"\n', "sqlite": 'auto_migrate = "false"\n'}
    file = tmp_path / "siglo.toml"
    # memory:// keeps every document whole (no incremental_min_bytes).
    incremental = "" if kind == "memory" else 'incremental_min_bytes = "16384"\n'
    file.write_text(
        f'url = "{url[kind]}"\n[options]\ncheckpoint_ttl_ms = "none"\n'
        f"{incremental}{extra.get(kind, '')}"
    )
    settings = load_settings(environ={"SIGLO_CONFIG": str(file)})
    async with siglo.connect(settings=settings) as backend:
        adapter: Any = backend.raw_adapter
        assert adapter.checkpoint_ttl_ms is None
        assert kind == "memory" or adapter.incremental_min_bytes == 16384
        if kind == "redis":
            assert "auto_pipeline=false" in backend.url
        elif kind == "sqlite":  # a new file, not migrated: auto_migrate is off
            with pytest.raises(siglo.SigloError, match="siglo migrate"):
                await backend.adapter.get_checkpoint("any")
    file.write_text(f'url = "{url[kind]}"\n[options]\ncheckpoint_ttl_ms = "never"\n')
    settings = load_settings(environ={"SIGLO_CONFIG": str(file)})
    with pytest.raises(InvalidArgumentError) as refused:
        siglo.connect(settings=settings)
    assert "option checkpoint_ttl_ms must be an integer, got 'never'" in str(refused.value)
    assert "URL option" not in str(refused.value) and str(file) in str(refused.value)


def test_no_error_quotes_a_key_written_as_a_key_id(tmp_path: Path) -> None:
    """A key in URL-safe base64 without its padding reads as a key id: written as
    ``encryption_key_id``, or as the id of an entry with an empty key (``<key>=``), the
    errors refusing it quoted it whole (a black-box auditor). They give its length; a
    short id, which cannot be a key, is still quoted."""
    import base64

    from siglo.keys import SettingsKeyProvider

    key = base64.urlsafe_b64encode(bytes(range(100, 132))).decode().rstrip("=")
    other = base64.b64encode(bytes(32)).decode()
    cases: list[dict[str, str]] = [
        {"SIGLO_ENCRYPTION_KEYS": f"k1={other}", "SIGLO_ENCRYPTION_KEY_ID": key},
        {"SIGLO_ENCRYPTION_KEYS": f"{key}="},
    ]
    for environ in cases:
        with pytest.raises(InvalidArgumentError) as refused:
            load_settings(start=tmp_path, environ=environ)
        assert key[:12] not in str(refused.value), refused.value
        assert "43 characters, not shown" in str(refused.value), refused.value
    with pytest.raises(InvalidArgumentError) as refused:
        SettingsKeyProvider({"k1": bytes(32)}, active=key)
    assert key[:12] not in str(refused.value), refused.value
    environ = {"SIGLO_ENCRYPTION_KEYS": f"k1={other}", "SIGLO_ENCRYPTION_KEY_ID": "k2"}
    with pytest.raises(InvalidArgumentError, match="'k2' is not one of encryption_keys"):
        load_settings(start=tmp_path, environ=environ)


def test_no_error_or_listing_prints_a_key_written_out_of_its_place(tmp_path: Path) -> None:
    """A key written where its id goes (``SIGLO_ENCRYPTION_KEYS=<key>`` without ``id=``,
    or ``k1:<key>``) was quoted whole by the error refusing it as an id; a master key
    written ``BASE64:<key>`` (or with a space before ``base64``) passed as a KMS
    reference, and ``siglo config`` and ``repr(settings)`` showed it (a black-box
    auditor). The id is not quoted; ``base64`` is read whatever its case or spacing, its
    key masked and used."""
    import asyncio
    import base64

    from siglo.keys import LocalMasterKey, master_key_from

    key = base64.b64encode(bytes(range(200, 232))).decode()
    assert "+" in key or "/" in key  # not a valid id once its padding is split off
    for written in (key, f"k1:{key}", f"k1={key},{key}"):
        with pytest.raises(InvalidArgumentError) as refused:
            load_settings(start=tmp_path, environ={"SIGLO_ENCRYPTION_KEYS": written})
        assert key[:12] not in str(refused.value), refused.value
        assert "id=base64key" in str(refused.value)
    for written in (f"BASE64:{key}", f" base64:{key}", f"Base64:{key}"):
        settings = load_settings(start=tmp_path, environ={"SIGLO_MASTER_KEY": written})
        for shown in (repr(settings), str(settings.describe())):
            assert key[:12] not in shown, shown
        assert settings.describe()["master_key"].endswith(":***")
        local = master_key_from(written)
        assert isinstance(local, LocalMasterKey)
        wrapped = asyncio.run(master_key_from(f"base64:{key}").wrap(bytes(32), b"ctx"))
        assert asyncio.run(local.unwrap(wrapped, b"ctx")) == bytes(32)  # the same key


def test_a_urls_own_unknown_option_is_not_blamed_on_the_settings_file(tmp_path: Path) -> None:
    """``?key_prefix=`` (a Redis URL's option is ``prefix``) with ``prefix`` in the
    file's ``[options]``: the error said the option came from the file, because the
    file's name appeared in its "did you mean prefix?"."""
    settings = Settings(options={"prefix": "abc:"}, source="siglo.toml")
    with pytest.raises(InvalidArgumentError) as refused:
        siglo.connect("redis://127.0.0.1:6379/0?key_prefix=x", settings=settings)
    assert "did you mean prefix?" in str(refused.value)
    assert "[options]" not in str(refused.value)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres", "redis"])
@pytest.mark.parametrize(
    ("line", "message"),
    [
        # The everyday TOML slip: the key after the [options] header belongs to the table.
        ('url = "{url}"', r"options: url is not a backend option but a setting of its own"),
        ('clock = "1"', r"options: clock takes a siglo.Clock, an object settings cannot hold"),
        ('client = "redis://x"', r"options: client takes a Redis client"),
        ("prefix = [1, 2]", r"options: prefix must be text, a number or true/false"),
    ],
)
def test_options_the_settings_cannot_hold_are_refused_naming_them_and_the_file(
    kind: str, line: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``url`` under ``[options]`` made every ``siglo.connect()`` raise a bare
    ``TypeError`` (multiple values for ``url``) and every command print "unexpected
    TypeError … report it"; ``clock = "…"`` was taken by SQLite and PostgreSQL and failed
    later with an ``AttributeError`` (a black-box auditor). Both are refused when the
    settings are read, naming the option and the file, on every backend: nothing is
    connected (the servers named here do not exist)."""
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path}/app.db",
        "postgres": "postgresql://siglo@127.0.0.1:1/app",
        "redis": "redis://127.0.0.1:1/0",
    }[kind]
    file = tmp_path / "siglo.toml"
    file.write_text(f'url = "{url}"\n[options]\n{line.format(url=url)}\n')
    with pytest.raises(InvalidArgumentError, match=message) as refused:
        load_settings(environ={"SIGLO_CONFIG": str(file)})
    assert str(file) in str(refused.value)
    monkeypatch.setenv(CONFIG_ENV, str(file))  # the process's settings, read by connect()
    with pytest.raises(InvalidArgumentError, match=message):
        siglo.connect()
    done = CliRunner().invoke(cli, ["ls", url], env={"SIGLO_CONFIG": str(file)})
    assert done.exit_code != 0
    assert "unexpected" not in done.output and re.search(message, done.output), done.output
    assert not (tmp_path / "app.db").exists()


def test_options_given_in_code_hold_data_only_too() -> None:
    """``siglo.configure(options=…)`` and settings built in code: the same refusals (an
    object goes to ``siglo.connect`` as a keyword, where it is taken)."""
    from siglo.clock import ManualClock

    with pytest.raises(InvalidArgumentError, match=r"options: url .*\(arguments\)"):
        configure(options={"url": "sqlite://"})
    with pytest.raises(InvalidArgumentError, match=r"options: clock takes a siglo\.Clock"):
        Settings(options={"clock": ManualClock()})
    with pytest.raises(InvalidArgumentError, match="options: schema must be text"):
        Settings(options={"schema": object()})
    settings = Settings(options={"checkpoint_ttl_ms": None, "table_prefix": "t_", "x": 1.5})
    assert dict(settings.options) == {"checkpoint_ttl_ms": None, "table_prefix": "t_", "x": 1.5}
    clock = ManualClock()
    backend = siglo.connect("memory://", clock=clock)
    try:
        assert backend.raw_adapter.clock is clock  # type: ignore[attr-defined]
    finally:
        asyncio.run(backend.aclose())
