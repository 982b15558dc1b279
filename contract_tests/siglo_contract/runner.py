"""Running the suite: :func:`run_contract` → a :class:`Report` with a verdict per rule."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal
from xml.sax.saxutils import escape, quoteattr

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from siglo.adapter import Capability
from siglo.errors import PluginError, SigloError, StorageAdapterError
from siglo.plugins import Deviation
from siglo_contract import registry
from siglo_contract.checks import all_checks
from siglo_contract.determinism import fixed_constants
from siglo_contract.hypothesis_home import in_hypothesis_home
from siglo_contract.machine_base import ContractMachine
from siglo_contract.registry import (
    EVIDENCE_DIRECT,
    EVIDENCE_FOCUSED,
    Check,
    CheckContext,
    RuleViolation,
)
from siglo_contract.rules import ADAPTER_RULES, Rule, primary_order, select_rules
from siglo_contract.scrubbing import scrubber
from siglo_contract.target import (
    OPTION_PROFILES,
    BackendFactory,
    Session,
    Target,
    new_prefix,
)

__all__ = ["PROFILES", "Report", "RuleResult", "Verdict", "run_contract", "run_option_profiles"]

Verdict = Literal["pass", "FAIL", "not supported", "not run", "declared"]
"""``declared``: the rule fails and the backend declares the deviation (its plugin's
registration); a declared rule that passes is a ``FAIL`` (the declaration is stale)."""

PROFILES: Final[dict[str, dict[str, int]]] = {
    "ci": {"max_examples": 25, "stateful_step_count": 25, "workflow_lock_hold_ms": 1000},
    "thorough": {"max_examples": 400, "stateful_step_count": 60, "workflow_lock_hold_ms": 3000},
}
"""Budgets per profile: examples and steps per state machine, and how long the first
action of ``workflow_lock_exclusive`` holds the lock while the others wait (a backend
whose waiters give up and run after less than that shows as an overlap). ``ci`` (the
default) keeps a whole run to seconds on local backends; ``thorough`` is for long runs."""

_MAX_MACHINE_RERUNS: Final = 3


@dataclass
class RuleResult:
    """The verdict on one rule, and for a failure the (shrunk) counter-example."""

    rule: Rule
    verdict: Verdict
    detail: str = ""
    checks: list[str] = field(default_factory=list)
    evidence: int = 0
    """For a failure: how directly it was seen (``registry.EVIDENCE_*``, higher is better)."""
    seconds: float = 0.0
    """How long the checks of this rule ran (a check of several rules counts for each)."""
    deviation: Deviation | None = None
    """The backend's declared deviation from this rule, if any."""

    @property
    def declared_reason(self) -> str:
        """For a rule reported declared: the deviation's kind and reason, as the plugin
        registered them (``"not-yet: not atomic across processes yet"``); else ``""``."""
        if self.verdict != "declared" or self.deviation is None:
            return ""
        return f"{self.deviation.kind}: {self.deviation.reason}"


@dataclass
class Report:
    """What :func:`run_contract` found."""

    target: str
    seed: int
    profile: str
    results: dict[str, RuleResult]
    seconds: float = 0.0
    storage: str | None = None
    """The URL of the isolated storage the run used (a temporary file, a key prefix's
    server), when the backend has one."""
    target_object: Target | None = field(default=None, repr=False)
    """The target the run checked (its plugin registration, capabilities, deviations)."""
    option_profiles: tuple[str, ...] = ("suite",)
    """The option profiles (:data:`~siglo_contract.target.OPTION_PROFILES`) every rule ran
    under: the suite's options alone, or also a user's defaults
    (:func:`run_option_profiles`)."""
    selection: tuple[str, ...] = ()
    """The rule patterns the run was limited to (``--rule``; empty: every rule). A report
    of a selection lists the other rules as not run, so it never reads as a full pass."""
    examples: int | None = None
    """The examples per state machine the run was given instead of its profile's."""

    @property
    def failures(self) -> list[RuleResult]:
        """The rules that failed."""
        return [r for r in self.results.values() if r.verdict == "FAIL"]

    @property
    def primary(self) -> RuleResult | None:
        """The failure that names the broken rule: the best-evidenced one (a focused check
        beats a state machine's direct assertion, which beats a divergence from the
        reference), and among equals the most basic rule (``rules.primary_order``)."""
        if not self.failures:
            return None
        order = primary_order()
        return min(self.failures, key=lambda r: (-r.evidence, order[r.rule.id]))

    @property
    def consequences(self) -> list[RuleResult]:
        """The failures other than :attr:`primary` (most often symptoms of the same bug)."""
        primary = self.primary
        return [r for r in self.failures if r is not primary]

    @property
    def ok(self) -> bool:
        """True when no rule failed (rules not supported are not failures)."""
        return not self.failures

    def verdict(self, rule_id: str) -> Verdict:
        """The verdict on ``rule_id``."""
        return self.results[rule_id].verdict

    def to_junit_xml(self) -> str:
        """A JUnit XML report: one test case per rule; not supported is skipped."""
        cases = []
        for res in self.results.values():
            body = ""
            if res.verdict == "FAIL":
                first = res.detail.splitlines()[0] if res.detail else "failed"
                body = f"<failure message={quoteattr(first)}>{escape(res.detail)}</failure>"
            elif res.verdict == "declared":
                # Skipped, with the reason the backend declared (and what was seen).
                message = quoteattr(f"declared ({res.declared_reason})")
                body = f"<skipped message={message}>{escape(res.detail)}</skipped>"
            elif res.verdict != "pass":
                body = f"<skipped message={quoteattr(res.verdict)}/>"
            name = quoteattr(res.rule.id)
            cases.append(f'  <testcase classname="siglo.contract" name={name}>{body}</testcase>')
        failures = len(self.failures)
        skipped = sum(r.verdict not in ("pass", "FAIL") for r in self.results.values())
        return (
            '<?xml version="1.0" encoding="utf-8"?>\n'
            f"<testsuite name={quoteattr('siglo contract: ' + self.target)} "
            f'tests="{len(self.results)}" failures="{failures}" skipped="{skipped}" '
            f'time="{self.seconds:.3f}">\n' + "\n".join(cases) + "\n</testsuite>\n"
        )


Progress = Callable[[str, Check, str], None]
"""``progress(event, check, message)``; events are ``"start"``, ``"pass"``, ``"fail"``."""


@dataclass
class _CheckOutcome:
    completed: bool = False
    seconds: float = 0.0
    failed: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, int] = field(default_factory=dict)

    def add(self, rule_id: str, detail: str, evidence: int) -> None:
        """Record the first failure of ``rule_id`` (and the best evidence seen for it)."""
        self.failed.setdefault(rule_id, detail)
        self.evidence[rule_id] = max(self.evidence.get(rule_id, 0), evidence)


@in_hypothesis_home
@fixed_constants()
def run_contract(
    target: str | BackendFactory | Target,
    *,
    rules: Iterable[str] | None = None,
    examples: int | None = None,
    seed: int | None = None,
    profile: str = "ci",
    capabilities: Iterable[Capability | str] | None = None,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    keep_going: bool = True,
    on_plan: Callable[[list[Check]], None] | None = None,
    only: Callable[[Check], bool] | None = None,
    deviations: Iterable[Deviation] | None = None,
) -> Report:
    """Run the contract suite against ``target`` and return a verdict per adapter rule.

    ``target`` is a backend URL (resolved through the plugin registry), a factory
    ``(**options) -> siglo.Backend`` (called once per example; ``capabilities`` default to
    what the backend declares), or a :class:`Target`. ``rules`` are glob patterns of rule
    ids (``"checkpoint.*"``); ``examples`` overrides the profile's number of examples per
    state machine; ``seed`` makes the run deterministic (a random one is picked and
    reported otherwise). With ``keep_going`` (the default) a state machine that failed on
    one rule is run again without that rule's comparisons, so the others get a verdict
    too. ``options`` go to the backend's factory (defaults:
    :data:`~siglo_contract.target.DEFAULT_OPTIONS`).
    ``on_plan`` is told the checks that will run, once the backend has opened its storage
    and answered a first read, before the first check starts. ``only``
    narrows the run to the checks it accepts (a rule none of whose checks ran is
    ``"not run"``); every failure those checks see is reported, whatever its rule.
    ``deviations`` (default: what the target's plugin registration declares) are rules
    the backend does not meet: a failure of one is ``"declared"``, not a failure, and
    a declared rule that passes fails (the declaration must stay true).

    Before any check, a URL target's backend must answer one read within
    :data:`PROBE_TIMEOUT_S`: an unreachable backend raises
    :class:`~siglo.errors.StorageAdapterError` once, instead of failing every rule.
    Synchronous: call it outside a running event loop. Hypothesis keeps its caches in
    siglo's user cache directory meanwhile, not in the working directory
    (:mod:`siglo_contract.hypothesis_home`).
    """
    if seed is None:
        seed = random.getrandbits(32)
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    if isinstance(target, Target):
        tgt = target
    elif isinstance(target, str):
        tgt = Target.from_url(target, options=options)
    else:
        caps = None if capabilities is None else frozenset(Capability(c) for c in capabilities)
        tgt = Target.from_factory(target, capabilities=caps, options=options)
    selected = select_rules(rules)
    selected_ids = {r.id for r in selected}
    declared = {d.rule: d for d in (tgt.deviations if deviations is None else deviations)}
    unknown = sorted(set(declared) - {r.id for r in ADAPTER_RULES})
    if unknown:
        # A PluginError: the plugin's registration is wrong (the CLI says so, with a hint,
        # rather than "unexpected ValueError … report it").
        raise PluginError(
            f"declared deviations from rules that are not adapter rules of docs/contract.md: "
            f"{', '.join(unknown)}; fix the plugin's registration (add_backend(deviations=…))"
        )
    budget = dict(PROFILES[profile])
    if examples is not None:
        budget["max_examples"] = examples
    hyp_settings = settings(
        deadline=None,
        database=None,
        derandomize=False,
        print_blob=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        phases=[p for p in Phase if p is not Phase.explain],
        max_examples=budget["max_examples"],
        stateful_step_count=budget["stateful_step_count"],
    )

    started = time.monotonic()
    outcomes: dict[str, _CheckOutcome] = {}
    # Found once a run: finding them reads every check module's attributes, and the
    # verdicts below ask for each rule's (once a rule, that was 40 % of the CPU of a
    # trimmed run against an in-memory mutant).
    checks = all_checks()
    to_run = [
        c
        for c in checks
        if selected_ids.intersection(c.rules)
        and c.capabilities() <= tgt.capabilities
        and (only is None or only(c))
    ]
    storage: str | None = None
    loop = asyncio.new_event_loop()
    try:
        session = tgt.session(budget)
        try:
            loop.run_until_complete(session.__aenter__())
        except SigloError:
            raise
        except Exception as exc:
            raise StorageAdapterError(
                f"cannot open isolated storage on {tgt.label}: {type(exc).__name__}: {exc}"
            ) from exc
        storage = session.shared_url
        try:
            if tgt.url is not None:
                loop.run_until_complete(_probe(session, tgt.label))
        except BaseException:
            # The backend is unreachable: its clean-up would only fail the same way, and
            # is given no longer than the probe was (a hung server answers neither).
            with contextlib.suppress(Exception):
                loop.run_until_complete(
                    asyncio.wait_for(session.__aexit__(None, None, None), PROBE_TIMEOUT_S)
                )
            raise
        try:
            # Told once the backend opened its storage and answered: a URL it refuses
            # (an unknown option, a bad database) is one error, no plan printed before.
            if on_plan is not None:
                on_plan(list(to_run))
            for chk in to_run:
                if progress:
                    progress("start", chk, "")
                began = time.monotonic()
                if chk.machine is not None:
                    out = _run_machine(chk, session, loop, hyp_settings, seed, keep_going)
                else:
                    random.seed(seed)
                    out = _run_async_check(chk, session, loop)
                out.seconds = time.monotonic() - began
                outcomes[chk.name] = out
                if progress:
                    msg = ", ".join(sorted(out.failed))
                    progress("fail" if out.failed else "pass", chk, msg)
        finally:
            loop.run_until_complete(session.__aexit__(None, None, None))
    finally:
        loop.close()

    results: dict[str, RuleResult] = {}
    judged = list(selected)
    by_id = {r.id: r for r in ADAPTER_RULES}
    for r in judged:  # grows: see below
        names = [c.name for c in to_run if r.id in c.rules]
        if r.capability is not None and r.capability not in tgt.capabilities:
            results[r.id] = RuleResult(
                r, "not supported", f"capability {r.capability.value!r} not declared"
            )
            continue
        needs = [c.capabilities() - tgt.capabilities for c in checks if r.id in c.rules]
        if needs and all(needs):
            # Every check of the rule needs a part the backend does not have (the rule
            # is about that part: payload.results and the idempotency store): not
            # supported, as for a rule's own capability — not "not run", which says a
            # run left it out.
            missing = sorted({cap.value for need in needs for cap in need})
            results[r.id] = RuleResult(
                r,
                "not supported",
                f"capability {', '.join(map(repr, missing))} not declared (its checks need it)",
            )
            continue
        failed = sorted(
            ((o.evidence[r.id], o.failed[r.id]) for o in outcomes.values() if r.id in o.failed),
            key=lambda f: -f[0],
        )
        seconds = sum(outcomes[n].seconds for n in names if n in outcomes)
        deviation = declared.get(r.id)
        if failed:
            # The best-evidenced witness first; a second one (often a state machine's
            # counter-example program) shows the rule broken in context.
            detail = "\n\nAlso seen by another check:\n".join(f[1] for f in failed[:2])
            verdict: Verdict = "FAIL" if deviation is None else "declared"
            results[r.id] = RuleResult(r, verdict, detail, names, failed[0][0], seconds, deviation)
        elif any(outcomes[n].completed for n in names):
            if deviation is None:
                results[r.id] = RuleResult(r, "pass", "", names, seconds=seconds)
            else:
                results[r.id] = RuleResult(
                    r,
                    "FAIL",
                    f"[{r.id}] the backend declares a deviation from this rule "
                    f"({deviation.kind}: {deviation.reason}), but the rule passes: remove "
                    "the declaration from the plugin's registration",
                    names,
                    EVIDENCE_FOCUSED,
                    seconds,
                    deviation,
                )
        else:
            stopped_by = sorted({f for n in names if n in outcomes for f in outcomes[n].failed})
            why = "no check of this rule completed"
            if stopped_by:
                why += f" (each stopped at a failure of {', '.join(stopped_by)})"
            results[r.id] = RuleResult(r, "not run", why, names, seconds=seconds)
            # What stopped it is reported too, selected or not: a run limited to this
            # rule would otherwise pass with it "not run" over a broken backend.
            judged.extend(by_id[f] for f in stopped_by if f in by_id and by_id[f] not in judged)
    # A counter-example quotes what the backend raised, which may quote its URL: no
    # output made from this report holds the URL's secrets.
    scrub = scrubber(tgt.url)
    results = {k: replace(v, detail=scrub(v.detail)) if v.detail else v for k, v in results.items()}
    return Report(
        tgt.label,
        seed,
        profile,
        results,
        time.monotonic() - started,
        storage,
        tgt,
        selection=tuple(p for p in rules or () if p),
        examples=examples,
    )


_SEVERITY: Final[dict[str, int]] = {
    "declared": 0,
    "FAIL": 1,
    "not run": 2,
    "pass": 3,
    "not supported": 4,
}
"""Which profile's verdict a merged report keeps: a rule fails if it fails under any
profile; a declared deviation seen failing under one profile is still true."""


def run_option_profiles(
    target: str | BackendFactory,
    profiles: Iterable[str] = tuple(OPTION_PROFILES),
    *,
    seed: int | None = None,
    **kwargs: Any,
) -> Report:
    """Run the suite once per option profile (:data:`~siglo_contract.target.OPTION_PROFILES`:
    ``suite``, the suite's explicit retention and TTLs; ``user-defaults``, what a user's
    ``siglo.connect`` gives, no option at all: the backend's own defaults, held to
    :data:`siglo.settings.DEFAULTS`) with the same seed, and merge the
    verdicts: a rule passes only if it passes under every profile, and a failure's
    detail names the profile it was seen under. ``kwargs`` go to :func:`run_contract`
    (``options`` excepted: the profiles are the options)."""
    names = list(dict.fromkeys(profiles))
    unknown = [p for p in names if p not in OPTION_PROFILES]
    if not names or unknown:
        raise ValueError(
            f"unknown option profile(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(OPTION_PROFILES)}"
        )
    if "options" in kwargs:
        raise TypeError("run_option_profiles takes profiles, not options")
    if seed is None:
        seed = random.getrandbits(32)
    reports = {
        name: run_contract(target, seed=seed, options=dict(OPTION_PROFILES[name]), **kwargs)
        for name in names
    }
    first = next(iter(reports.values()))
    results: dict[str, RuleResult] = {}
    for rule_id in first.results:
        per = [(name, rep.results[rule_id]) for name, rep in reports.items()]
        name, chosen = min(per, key=lambda item: _SEVERITY[item[1].verdict])
        detail = chosen.detail
        if len(per) > 1 and chosen.verdict not in ("pass", "not supported"):
            detail = f"[option profile {name}] {detail}"
        seconds = sum(res.seconds for _, res in per)
        results[rule_id] = replace(chosen, detail=detail, seconds=seconds)
    return Report(
        first.target,
        seed,
        first.profile,
        results,
        sum(rep.seconds for rep in reports.values()),
        first.storage,
        first.target_object,
        tuple(reports),
        first.selection,
        first.examples,
    )


PROBE_TIMEOUT_S: Final = 10.0
"""How long the backend has to answer the read that starts a run."""


async def _probe(session: Session, label: str) -> None:
    """One cheap read, so an unreachable backend is one clear error, not 40 failed rules.

    Only a failure to reach the backend counts; anything else the checks judge.
    """
    async with session.backend() as backend:
        adapter = backend.adapter
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                if adapter.supports(Capability.CHECKPOINTS):
                    await adapter.get_checkpoint(new_prefix() + "probe")
                elif backend.idempotency is not None:
                    await backend.idempotency.get(new_prefix() + "probe")
        except (StorageAdapterError, OSError, TimeoutError) as exc:
            # The probe's own bound says nothing (a bare TimeoutError): say what it was.
            why = str(exc) or (
                f"no answer within {PROBE_TIMEOUT_S:g} s"
                if isinstance(exc, TimeoutError)
                else type(exc).__name__
            )
            raise StorageAdapterError(f"cannot reach the backend at {label}: {why}") from exc


def _describe(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    return "\n".join([str(exc), *notes])


def _run_async_check(
    chk: Check, session: Session, loop: asyncio.AbstractEventLoop
) -> _CheckOutcome:
    assert chk.fn is not None
    out = _CheckOutcome()
    contexts: list[CheckContext] = []

    bounds: list[asyncio.Timeout] = []

    async def body() -> None:
        async with asyncio.timeout(registry.CHECK_TIMEOUT_S) as bound:
            bounds.append(bound)
            async with session.backend() as backend:
                ctx = CheckContext(session, backend, new_prefix())
                contexts.append(ctx)
                await chk.fn(ctx)  # type: ignore[misc]

    try:
        loop.run_until_complete(body())
        out.completed = True
    except RuleViolation as exc:
        out.add(exc.rule_id, f"{chk.name}: {_describe(exc)}", exc.evidence)
    except TimeoutError as exc:
        blamed = (contexts[0].current_rule if contexts else None) or chk.rules[0]
        if not (bounds and bounds[0].expired()):
            tb = "".join(traceback.format_exception(exc, limit=-3))
            out.add(blamed, f"[{blamed}] {chk.name} raised {exc!r}\n{tb}", EVIDENCE_DIRECT)
        else:
            out.add(
                blamed,
                f"[{blamed}] {chk.name} did not finish within {registry.CHECK_TIMEOUT_S:g} s: a "
                "call of the backend never returned",
                EVIDENCE_DIRECT,
            )
    except Exception as exc:
        # Blamed on the step that was running, with less weight than a seen violation:
        # an error is a symptom whose cause may be an earlier step's rule.
        blamed = (contexts[0].current_rule if contexts else None) or chk.rules[0]
        tb = "".join(traceback.format_exception(exc, limit=-3))
        out.add(blamed, f"[{blamed}] {chk.name} raised {exc!r}\n{tb}", EVIDENCE_DIRECT)
    return out


def _run_machine(
    chk: Check,
    session: Session,
    loop: asyncio.AbstractEventLoop,
    hyp_settings: settings,
    seed: int,
    keep_going: bool,
) -> _CheckOutcome:
    assert chk.machine is not None
    base = chk.machine()
    out = _CheckOutcome()
    skip: set[str] = set()
    for _ in range(_MAX_MACHINE_RERUNS if keep_going else 1):
        attrs = {"session": session, "loop": loop, "skip": frozenset(skip)}
        machine_cls = type(base.__name__, (base,), attrs)
        assert issubclass(machine_cls, ContractMachine)
        machine_cls = hypothesis_seed(seed)(machine_cls)
        lines: list[str] = []

        def collect(line: object, sink: list[str] = lines) -> None:
            sink.append(str(line))

        try:
            with with_reporter(collect):
                run_state_machine_as_test(machine_cls, settings=hyp_settings)  # type: ignore[no-untyped-call,unused-ignore]  # untyped before hypothesis 6.16x
        except RuleViolation as exc:
            program = "\n".join(lines)
            detail = (
                f"{_describe(exc)}\nFalsifying program:\n{program}" if program else _describe(exc)
            )
            # A machine's evidence is at most direct: only a focused check, a call made
            # for one rule, is focused evidence. (A trimmed mutation run relies on it: a
            # focused failure cannot be outranked by a machine it did not run.)
            out.add(exc.rule_id, detail, min(exc.evidence, EVIDENCE_DIRECT))
            skip.add(exc.rule_id)
            continue
        except Exception as exc:
            tb = "".join(traceback.format_exception(exc, limit=-4))
            out.add(
                chk.rules[0],
                f"[{chk.rules[0]}] {chk.name} raised {exc!r}\n{tb}\n" + "\n".join(lines),
                0,
            )
            break
        out.completed = True
        break
    return out
