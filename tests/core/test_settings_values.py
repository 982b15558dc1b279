"""Every setting's kind is checked in one place, whichever way the settings are given —
``siglo.Settings(...)``, ``Settings.replace``, ``siglo.configure``, ``load_settings``
arguments, a settings file, a ``SIGLO_*`` variable — and a value of the wrong kind is
refused with ``InvalidArgumentError`` naming the setting (and the file or variable it
came from), never a bare ``TypeError`` (docs/configuration.md).

A black-box auditor found ``Settings(encryption_key_id=5)``, ``error_mode=["strict"]``
and ``blind_index_fields=5`` escaping as ``TypeError`` (``siglo config`` printed
"unexpected TypeError … report it"), the file's ``error_mode = ["strict"]`` refused
without the setting's name, and ``Settings(bogus=1)`` a ``TypeError`` where
``configure(bogus=1)`` named the known settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from settings_support import clean_settings  # noqa: F401  (autouse: a clean slate)

import siglo
from siglo import sync
from siglo.cli import cli
from siglo.config import (
    ENVIRONMENT,
    SETTING_NAMES,
    Settings,
    configure,
    load_settings,
    reset_settings,
)
from siglo.errors import InvalidArgumentError


class _Opaque:
    """An object of no kind a setting takes."""


WRONG_KINDS: list[Any] = [
    5,
    -1,
    True,
    2.5,
    "",
    "text",
    b"bytes",
    ["strict"],
    [5],
    [["nested"]],
    {"k": 1},
    {5: "x"},
    {"k": ["list"]},
    (x for x in [1]),
    _Opaque(),
]
"""Values of every kind (some right for some settings): each setting either takes one
or refuses it naming itself, whatever it is."""

REFUSED: list[tuple[str, Any]] = [
    ("encryption_key_id", 5),
    ("encryption_key_id", True),
    ("encryption_key_id", ["k1"]),
    ("encryption_key_id", {"k1": 1}),
    ("error_mode", ["strict"]),
    ("error_mode", {"strict": 1}),
    ("error_mode", 5),
    ("blind_index_fields", 5),
    ("blind_index_fields", "customer"),
    ("blind_index_fields", [5]),
    ("blind_index_fields", [""]),
    ("redact_fields", 5),
    ("redact_fields", [["card"]]),
    ("url", 5),
    ("blob_url", ["file:///x"]),
    ("master_key", 5),
    ("options", ["prefix"]),
    ("encryption_keys", ["k1"]),
    ("namespace_fallback", "false"),
    ("require_encryption", 1),
    ("command_timeout_ms", "5"),
    ("max_document_bytes", 2.5),
    ("compression_min_bytes", [1]),
    ("blob_grace_ms", None),
]
"""Values each setting must refuse (the auditor's first)."""


def _refused_naming(name: str, build: Any) -> str:
    with pytest.raises(InvalidArgumentError) as refused:
        build()
    message = str(refused.value)
    assert name in message, message
    return message


def _taken_or_refused_naming(name: str, build: Any, value: Any) -> None:
    """``build(name=value)`` takes the value, or refuses it with InvalidArgumentError
    naming ``name`` — any other exception (a TypeError, an AttributeError) fails the
    test."""
    message = None
    try:
        build(**{name: value})
    except InvalidArgumentError as refused:
        message = str(refused)
    assert message is None or name in message, message


@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_a_value_of_the_wrong_kind_is_refused_naming_the_setting_in_code(
    name: str, value: Any
) -> None:
    _refused_naming(name, lambda: Settings(**{name: value}))
    _refused_naming(name, lambda: Settings().replace(**{name: value}))
    assert "(arguments)" in _refused_naming(name, lambda: configure(**{name: value}))
    assert "(arguments)" in _refused_naming(name, lambda: load_settings(**{name: value}))


@pytest.mark.parametrize("name", sorted(SETTING_NAMES))
def test_every_setting_takes_or_refuses_a_value_of_any_kind_naming_itself(name: str) -> None:
    """The mechanism: a setting added without a check of its kind fails here."""
    for value in WRONG_KINDS:
        _taken_or_refused_naming(name, Settings, value)
        _taken_or_refused_naming(name, configure, value)
        reset_settings()


def test_a_non_text_key_id_is_not_quoted() -> None:
    """A key id's place may hold a key by mistake: a value that is not text is named by
    its kind, never shown whole."""
    secret = "A" * 43
    message = _refused_naming("encryption_key_id", lambda: Settings(encryption_key_id=[secret]))
    assert secret not in message and "got a list" in message
    assert "got 5" in _refused_naming("encryption_key_id", lambda: Settings(encryption_key_id=5))


def test_an_unknown_setting_is_refused_by_settings_as_by_configure() -> None:
    by_settings = _refused_naming("bogus", lambda: Settings(**{"bogus": 1}))
    by_configure = _refused_naming("bogus", lambda: configure(bogus=1))
    assert by_settings.startswith("unknown setting(s) 'bogus' in Settings(); known: ")
    assert by_settings.partition("known: ")[2] == by_configure.partition("known: ")[2]
    assert Settings(source="code").source == "code"  # not a setting, but a field


def test_blind_index_fields_from_a_generator_keep_their_names() -> None:
    # The check used to consume a generator, leaving no field to index.
    settings = Settings(blind_index_fields=(name for name in ["customer", "region"]))
    assert settings.blind_index_fields == frozenset({"customer", "region"})


@pytest.mark.parametrize("given", [{"url": "memory://"}, "memory://", 5])
def test_settings_that_are_not_a_settings_object_are_refused(given: Any) -> None:
    _refused_naming("settings must be a siglo.Settings", lambda: configure(given))
    _refused_naming("settings must be a siglo.Settings", lambda: siglo.connect(settings=given))


TOML_VALUES = ["5", "-1", "true", "2.5", '""', '"text"', '["strict"]', "[5]", "[[1]]", "{ a = 1 }"]


@pytest.mark.parametrize("name", sorted(SETTING_NAMES))
def test_every_setting_of_the_file_takes_or_refuses_a_value_naming_it_and_the_file(
    name: str, tmp_path: Path
) -> None:
    file = tmp_path / "siglo.toml"
    for value in TOML_VALUES:
        file.write_text(f"{name} = {value}\n")
        try:
            load_settings()
        except InvalidArgumentError as refused:
            message = str(refused)
            assert name in message and str(file.resolve()) in message, (value, message)


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("encryption_key_id = 5", "encryption_key_id"),
        ('encryption_key_id = ["k1"]', "encryption_key_id"),
        ('error_mode = ["strict"]', "error_mode"),
        ("blind_index_fields = 5", "blind_index_fields"),
        ('url = ["sqlite:///x.db"]', "url"),
    ],
)
def test_siglo_config_names_the_setting_and_the_file(line: str, name: str, tmp_path: Path) -> None:
    file = tmp_path / "siglo.toml"
    file.write_text(line + "\n")
    with pytest.raises(InvalidArgumentError) as refused:
        load_settings()
    assert name in str(refused.value) and str(file.resolve()) in str(refused.value)
    shown = CliRunner().invoke(cli, ["config"])
    assert shown.exit_code == 1, shown.output
    assert "unexpected" not in shown.output and "TypeError" not in shown.output, shown.output
    assert name in shown.output and "siglo.toml" in shown.output, shown.output


ENV_VALUES = ["5", "true", "text", "[1]", " ", "a,b", "k1=5", "none", "-1"]


@pytest.mark.parametrize("variable", sorted(ENVIRONMENT))
def test_every_variable_takes_or_refuses_a_value_naming_it(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = ENVIRONMENT[variable]
    for value in ENV_VALUES:
        monkeypatch.setenv(variable, value)
        try:
            load_settings()
        except InvalidArgumentError as refused:
            message = str(refused)
            # Checks of one variable name it; those of settings that depend on each
            # other (a key id without its keys), checked once all are read, the setting.
            assert variable in message or name in message, (value, message)


@pytest.mark.parametrize("value", ["false", "true", 0, 1, [], "no"])
async def test_the_managers_namespace_fallback_is_true_false_or_none(value: Any) -> None:
    """``StorageManager(namespace_fallback="false")`` was taken, and its truth used: a
    tenant's reads fell back to the stacks saved without a namespace."""
    async with siglo.connect("memory://") as backend:
        message = _refused_naming(
            "namespace_fallback",
            lambda: siglo.StorageManager(backend, namespace_fallback=value),
        )
        assert repr(value) in message
        _refused_naming(
            "namespace_fallback",
            lambda: sync.StorageManager(backend, namespace_fallback=value),
        )
        await siglo.StorageManager(backend).create_stack("n1").save()
        closed = siglo.StorageManager(backend, namespace_fallback=False)
        assert await closed.resume("n1", namespace="tenant") is None
        following = siglo.StorageManager(backend, namespace_fallback=None)
        assert following.namespace_fallback is True  # the settings' default


@pytest.mark.parametrize("value", [["strict"], {"strict": 1}, 5, "loud"])
async def test_the_managers_error_mode_is_refused_naming_it(value: Any) -> None:
    async with siglo.connect("memory://") as backend:
        _refused_naming("error_mode", lambda: siglo.StorageManager(backend, error_mode=value))


@pytest.mark.parametrize("mode", [["strict"], {"warn": 1}, 5, None])
def test_set_error_mode_refuses_what_is_not_a_mode_by_name(mode: Any) -> None:
    """As the constructor does (a list raised a raw TypeError: unhashable)."""
    manager = siglo.StorageManager()
    with pytest.raises(siglo.InvalidArgumentError, match="error mode must be one of"):
        manager.set_error_mode(mode)


INTEGER_VARIABLES = sorted(
    variable
    for variable, name in ENVIRONMENT.items()
    if name in ("command_timeout_ms", "max_document_bytes", "offload_min_bytes")
)


@pytest.mark.parametrize("variable", INTEGER_VARIABLES)
@pytest.mark.parametrize("value", ["١٢٣٤", "1_000", "12\u0663"])
def test_an_integer_variable_takes_ascii_digits_only(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # int() reads digits of any script and underscores; a timeout or a byte count
    # written so is a typo or a paste, not a number anybody meant.
    monkeypatch.setenv("SIGLO_BLOB_URL", "file:///var/lib/app/blobs")  # offloading needs it
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidArgumentError, match=variable):
        load_settings()
    monkeypatch.setenv(variable, " 2048 ")
    assert getattr(load_settings(), ENVIRONMENT[variable]) == 2048


@pytest.mark.parametrize("value", ["1_000", "١٢٣٤٥", "５０００"])
def test_a_number_in_a_url_or_options_takes_ascii_digits_only(value: str) -> None:
    """As a variable's number: a URL's query, a keyword given as text, and the settings'
    [options] (read as the query reads them) took what int() takes."""
    for connect in (
        lambda: siglo.connect(f"sqlite:///unused.db?claim_lease_ms={value}"),
        lambda: siglo.connect("sqlite:///unused.db", claim_lease_ms=value),
        lambda: siglo.connect(
            settings=siglo.Settings(url="sqlite:///unused.db", options={"cache_ttl_ms": value})
        ),
    ):
        with pytest.raises(InvalidArgumentError, match=r"must be an integer"):
            connect()
