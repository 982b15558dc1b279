"""What a plugin declares: :class:`BackendSpec`, and the :class:`BackendRegistry` its
``siglo_register_backends`` hook adds them to."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from siglo.adapter import Capability
from siglo.errors import DriverNotInstalledError, PluginError

__all__ = ["BackendRegistry", "BackendSpec", "Deviation", "DeviationKind", "import_dotted"]

DeviationKind = Literal["not-yet", "by-design"]
"""Why a backend does not meet a rule: not implemented yet, or deliberately."""


@dataclass(frozen=True)
class Deviation:
    """A contract rule a backend declares it does not meet (``siglo check`` reports it as
    declared, not passed, and fails once the rule passes, so the declaration stays true).

    ``rule`` is a rule id of docs/contract.md, ``reason`` says why in a sentence, and
    ``kind`` is ``"not-yet"`` (not implemented yet) or ``"by-design"`` (never will be).
    """

    rule: str
    reason: str
    kind: DeviationKind = "not-yet"

    def __post_init__(self) -> None:
        if not isinstance(self.rule, str) or not self.rule:
            raise PluginError(f"a deviation needs a rule id, got {self.rule!r}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise PluginError(f"the deviation from {self.rule!r} needs a reason")
        if self.kind not in get_args(DeviationKind):
            raise PluginError(
                f"the deviation from {self.rule!r} has kind {self.kind!r}; "
                f"kinds: {', '.join(get_args(DeviationKind))}"
            )

    def to_wire(self) -> dict[str, str]:
        """The deviation as reports write it."""
        return {"rule": self.rule, "reason": self.reason, "kind": self.kind}


def import_dotted(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


@dataclass(frozen=True)
class BackendSpec:
    """A backend as a plugin declares it.

    ``factory`` is ``"module:callable"`` (imported lazily) or a callable taking
    ``(url, **options)`` and returning a :class:`~siglo.Backend`. ``requires`` names the
    driver modules it needs and ``extra`` the siglo extra that installs them, for the
    error shown when they are missing. ``isolated``, if given, is an async context
    manager factory ``(url, **options)`` that yields a backend on private storage (own
    key prefix, schema …) and removes it afterwards: the contract suite uses it.
    """

    name: str
    schemes: tuple[str, ...]
    factory: str | Callable[..., Any]
    capabilities: frozenset[Capability]
    requires: tuple[str, ...] = ()
    extra: str | None = None
    description: str = ""
    isolated: str | Callable[..., Any] | None = None
    multiprocess: bool = False
    """Whether several processes connecting to one URL share the same storage."""
    plugin: str = ""
    install_hint: str | None = None
    """What to install when a driver is missing, for a third-party plugin
    (``"pip install 'siglo-mystore[fast]'"``); the default names ``siglo[extra]``."""
    bounded: bool = False
    """Whether the factory takes ``command_timeout_ms``, the bound on every call to the
    server (SPEC §4): :func:`siglo.connect` passes the settings' bound to it."""
    blob_store: str | Callable[..., Any] | None = None
    """``"module:callable"`` (imported lazily) or a callable taking a URL of this backend
    and returning a :class:`~siglo.blobs.BlobStore` there, for ``blob_url`` (offloaded
    values, docs/large-state.md); ``None``: the backend keeps no blobs."""
    max_document_bytes: int | None = None
    """The largest checkpoint document (stored JSON bytes) the backend's store holds in
    one item (``None``: no limit of its own). :func:`siglo.connect` refuses larger saves
    with :class:`~siglo.errors.DocumentTooLargeError` before anything is written."""
    deviations: tuple[Deviation, ...] = ()
    """Contract rules the backend declares it does not meet (:class:`Deviation`)."""

    def install_command(self) -> str:
        """The command that installs this backend's drivers."""
        if self.install_hint:
            return self.install_hint
        if self.extra:
            # Pinned below 1: the package named siglo on PyPI (1.0.x) is unrelated.
            return f"pip install 'siglo[{self.extra}]>=0.1,<1'"
        return f"pip install {' '.join(self.requires)}" if self.requires else "nothing"

    def missing_drivers(self) -> list[str]:
        """Driver modules in ``requires`` that cannot be imported here."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    @property
    def driver_installed(self) -> bool:
        """Whether every driver module the backend needs is importable."""
        return not self.missing_drivers()

    def _require_drivers(self) -> None:
        missing = self.missing_drivers()
        if missing:
            raise DriverNotInstalledError(
                f"backend {self.name!r} needs {', '.join(missing)}, which is not installed: "
                f"{self.install_command()}"
            )

    def load_factory(self) -> Callable[..., Any]:
        """The factory callable, importing it (and checking drivers) on first use."""
        self._require_drivers()
        return import_dotted(self.factory) if isinstance(self.factory, str) else self.factory

    def load_blob_store(self) -> Callable[..., Any] | None:
        """The blob-store factory, if the backend declares one."""
        if self.blob_store is None:
            return None
        self._require_drivers()
        if isinstance(self.blob_store, str):
            return import_dotted(self.blob_store)  # type: ignore[no-any-return]
        return self.blob_store

    def load_isolated(self) -> Callable[..., Any] | None:
        """The isolation factory, if the backend declares one."""
        if self.isolated is None:
            return None
        self._require_drivers()
        return import_dotted(self.isolated) if isinstance(self.isolated, str) else self.isolated


class BackendRegistry:
    """Passed to ``siglo_register_backends``; collects the backends a plugin declares."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.backends: list[BackendSpec] = []

    def add_backend(
        self,
        name: str,
        *,
        schemes: Iterable[str],
        factory: str | Callable[..., Any],
        capabilities: Iterable[str | Capability] = (),
        requires: Iterable[str] = (),
        extra: str | None = None,
        description: str = "",
        isolated: str | Callable[..., Any] | None = None,
        multiprocess: bool = False,
        install_hint: str | None = None,
        bounded: bool = False,
        max_document_bytes: int | None = None,
        blob_store: str | Callable[..., Any] | None = None,
        deviations: Iterable[Deviation | dict[str, str]] = (),
    ) -> None:
        """Declare one backend; invalid declarations raise :class:`PluginError`.

        See :class:`BackendSpec` for the fields. ``deviations`` are :class:`Deviation`
        objects or mappings with ``rule``, ``reason`` and ``kind``.
        """
        schemes = tuple(s.lower() for s in schemes)
        if not name or not schemes:
            raise PluginError(f"plugin {self.plugin!r}: a backend needs a name and a scheme")
        if max_document_bytes is not None and (
            type(max_document_bytes) is not int or max_document_bytes <= 0
        ):
            raise PluginError(
                f"plugin {self.plugin!r}, backend {name!r}: max_document_bytes must be a "
                f"positive integer of bytes or None, got {max_document_bytes!r}"
            )
        try:
            caps = frozenset(Capability(c) for c in capabilities)
        except ValueError as exc:
            known = ", ".join(c.value for c in Capability)
            raise PluginError(
                f"plugin {self.plugin!r}, backend {name!r}: {exc}; known capabilities: {known}"
            ) from None
        self.backends.append(
            BackendSpec(
                name=name,
                schemes=schemes,
                factory=factory,
                capabilities=caps,
                requires=tuple(requires),
                extra=extra,
                description=description,
                isolated=isolated,
                multiprocess=multiprocess,
                plugin=self.plugin,
                install_hint=install_hint,
                bounded=bounded,
                max_document_bytes=max_document_bytes,
                blob_store=blob_store,
                deviations=self._deviations(name, deviations),
            )
        )

    def _deviations(
        self, name: str, declared: Iterable[Deviation | dict[str, str]]
    ) -> tuple[Deviation, ...]:
        out: list[Deviation] = []
        for item in declared:
            try:
                if isinstance(item, Deviation):
                    out.append(item)
                elif isinstance(item, dict):
                    unknown = set(item) - {"rule", "reason", "kind"}
                    if unknown:
                        raise PluginError(f"unknown fields {sorted(unknown)} in a deviation")
                    out.append(Deviation(**item))  # type: ignore[arg-type]
                else:
                    raise PluginError(f"a deviation is a Deviation or a dict, not {item!r}")
            except (PluginError, TypeError) as exc:
                raise PluginError(f"plugin {self.plugin!r}, backend {name!r}: {exc}") from None
        rules = [d.rule for d in out]
        twice = sorted({r for r in rules if rules.count(r) > 1})
        if twice:
            raise PluginError(
                f"plugin {self.plugin!r}, backend {name!r}: deviations from {twice} declared twice"
            )
        return tuple(out)
