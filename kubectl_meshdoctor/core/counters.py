"""Findings of Envoy's counters alone: what a detector's class looks like in `/stats`, and the finding a `/stats`
dump (or what moved during a watch) gives of it when nothing else in the run names the class.

A detector lists its CounterSignals (the stats that count its failure, with their scope) and builds its findings
with ``counter_findings`` in its ``from_counters``. Stat names and what moves them: Envoy's
docs/root/configuration/upstream/cluster_manager/cluster_stats.rst, http_conn_man/stats.rst,
listeners/stats.rst (docs/envoy-stats.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kubectl_meshdoctor.envoy.stats import istio_requests, scoped

from .events import EnvoyCountersEvent
from .findings import COUNTER, Evidence, Finding, NoFlow, Severity
from .fixes import Fix

_PREFIX = {"cluster": "cluster", "http": "http", "listener": "listener"}


def flag_signal(flag: str, means: str) -> CounterSignal:
    """The istio_requests_total requests Envoy logged with response flag ``flag``."""
    return CounterSignal("istio", flag, means)


@dataclass(frozen=True, slots=True)
class CounterSignal:
    """A stat that counts a detector's failure: ``scope`` "cluster", "http" (an HCM's stat prefix) or
    "listener" (a listener's address), the ``stat`` after it, and what one count ``means`` in words; or scope
    "istio" with a response flag as ``stat``: Istio's standard metric istio_requests_total, whose
    response_flags label counts the requests Envoy logged with that flag (in Istio's default stats inclusion
    list, so in a /stats dump where the cluster stats may not be; istio/istio docs, standard metrics)."""

    scope: str
    stat: str
    means: str


def moved(counters: EnvoyCountersEvent, signals: Sequence[CounterSignal]) -> dict[str, dict[CounterSignal, int]]:
    """Per owner (cluster, HCM prefix, listener, or istio_requests_total's reporter), the signals that counted
    something, and how much."""
    out: dict[str, dict[CounterSignal, int]] = {}
    requests = istio_requests(counters.stats) if any(s.scope == "istio" for s in signals) else {}
    for signal in signals:
        if signal.scope == "istio":
            counted: dict[str, int] = {}
            for (reporter, _code, flags), n in requests.items():
                if signal.stat in flags.split(","):
                    counted[reporter or "-"] = counted.get(reporter or "-", 0) + n
        else:
            counted = scoped(counters.stats, signal.scope, signal.stat)
        for owner, n in counted.items():
            if n > 0:
                out.setdefault(f"{signal.scope} {owner}", {})[signal] = n
    return out


def _stat_name(signal: CounterSignal, owner: str) -> str:
    if signal.scope == "istio":
        return f"istio_requests_total{{reporter={owner},response_flags={signal.stat}}}"
    return f"{_PREFIX[signal.scope]}.{owner}.{signal.stat}"


def since_text(counters: EnvoyCountersEvent) -> str:
    """``since Envoy's start (uptime 3 d 4 h)``, ``between the first dump and the last``, ``during the run``."""
    if counters.since == "Envoy's start":
        up = counters.uptime_s
        return "since Envoy's start" + (f" ({_duration(up)} before the dump)" if up is not None else "")
    return "between the first dump and the last" if counters.since == "the first dump" else "during the run"


def _duration(seconds: float) -> str:
    """``3 d 4 h``, ``5 h 12 min``, ``7 min``, ``15 s``: the two largest units, whole."""
    s = int(seconds)
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days} d" + (f" {hours} h" if hours else "")
    if hours:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    return f"{minutes} min" if minutes else f"{s} s"


def counter_findings(detector: str, counters: EnvoyCountersEvent, signals: Sequence[CounterSignal], *,
                     what: str, explanation: str, envoy_flags: tuple[str, ...] = (),
                     fixes: tuple[Fix, ...] = (), remediation: str = "", severity: Severity = Severity.ERROR,
                     pod: str | None = None) -> list[Finding]:
    """One finding per cluster (listener, HCM) whose ``signals`` counted something: titled ``what`` (the class
    in a few words), with each counter as evidence (kind COUNTER) and in ``counters``; ``explanation`` says what
    the class is and how the counters show it (the counts and their period are added)."""
    out = []
    for owner, counts in sorted(moved(counters, signals).items()):
        scope, _, name = owner.partition(" ")
        said = "; ".join(f"{_stat_name(signal, name)} {n} ({signal.means})" for signal, n in counts.items())
        where = f"istio_requests_total (reporter={name})" if scope == "istio" else f"{scope} {name}"
        when = since_text(counters)
        out.append(Finding(
            detector=detector,
            severity=severity,
            title=f"{what}: Envoy's counters of {where} show it {when}",
            variant=f"{what} (counters)",
            flow=NoFlow(COUNTER, name if scope != "istio" else "istio_requests_total"),
            evidence=tuple(Evidence.counter(counters.source, counters.ts, _stat_name(signal, name), f"{n} {when}")
                           for signal, n in counts.items()),
            envoy_flags=envoy_flags,
            explanation=f"{explanation} The sidecar's counters of {where} {when}: {said}.",
            fixes=fixes,
            remediation=remediation,
            pod=pod,
            ts=counters.ts,
            counters={_stat_name(signal, name): n for signal, n in counts.items()},
        ))
    return out
