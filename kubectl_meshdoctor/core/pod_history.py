"""What the pod's API objects say of its sidecar's runs, as evidence a lifecycle finding quotes: how istio-proxy's
latest run ended (its status's state.terminated while it is down, else lastState.terminated) and the kubelet's
events about its runs (Started, Killing, BackOff, Unhealthy: pkg/kubelet/events/event.go), as watch read them
when it began and, for a run with a lifecycle finding, again when it ended (core/events.py PodEvent;
kube/pod_events.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone

from .events import PodEvent
from .findings import SPEC, Evidence, Finding
from .remedies import SIDECAR_CONTAINER

# The kubelet's events that tell a sidecar's runs apart.
RUN_EVENTS = ("Started", "Killing", "BackOff", "Unhealthy")
MAX_RUN_EVENTS = 3  # the latest, quoted beside a finding
AFTER_S = 60.0  # events up to this many seconds after the finding's packet still belong to it


def iso(ts: float) -> str:
    """Seconds since the epoch as the API's timestamps read (``2026-12-04T14:19:03Z``)."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sidecar_runs_evidence(pod: PodEvent | None, ts: float) -> list[Evidence]:
    """istio-proxy's last run's end and the kubelet's latest MAX_RUN_EVENTS events about its runs up to AFTER_S
    after ``ts`` (seconds since the epoch), each a spec evidence of ``pod/NAME``; none without the pod."""
    if pod is None:
        return []
    where = f"pod/{pod.name}"
    out = []
    if pod.sidecar_last_exit is not None:
        x = pod.sidecar_last_exit
        out.append(Evidence.spec_field(
            where, f"status.containerStatuses[{SIDECAR_CONTAINER}].{'state' if x.down else 'lastState'}.terminated",
            f"exitCode {x.exit_code}, reason {x.reason or '-'}"
            + (f", finishedAt {iso(x.finished)}" if x.finished is not None else "")))
    runs = [e for e in pod.history
            if e.container == SIDECAR_CONTAINER and e.reason in RUN_EVENTS and e.ts <= ts + AFTER_S]
    for e in runs[-MAX_RUN_EVENTS:]:
        out.append(Evidence.spec_field(where, f"event {e.reason} ({e.container}, {iso(e.ts)})",
                                       e.message + (f" (x{e.count})" if e.count > 1 else "")))
    return out


def last_exit_words(pod: PodEvent | None) -> str:
    """A sentence on how istio-proxy's latest run ended ("" when not known): exit 137 named a SIGKILL."""
    if pod is None or pod.sidecar_last_exit is None:
        return ""
    x = pod.sidecar_last_exit
    run = "last" if x.down else "previous"
    return (f" Its {run} run ended with exit code {x.exit_code} ({x.reason or 'no reason given'})"
            + (": killed by SIGKILL, as the kernel's OOM killer or a kill -9 ends it" if x.exit_code == 137 else "")
            + ".")


def attach_sidecar_runs(findings: Iterable[Finding], pod: PodEvent, detectors: set[str]) -> list[Finding]:
    """``findings``, those of ``detectors`` that quote ``pod``'s status (their detector found its own sidecar
    concerned, not a peer's), with the runs evidence of ``pod`` (read again at the run's end) they do not quote
    yet: a sidecar's exit or restart watched, told by its status and events."""
    where = f"pod/{pod.name}"
    out = []
    for f in findings:
        if f.detector in detectors and any(e.kind == SPEC and e.source == where for e in f.evidence):
            have = {(e.name, e.what) for e in f.evidence}
            new = tuple(e for e in sidecar_runs_evidence(pod, f.ts) if (e.name, e.what) not in have)
            f = replace(f, evidence=f.evidence + new) if new else f
        out.append(f)
    return out
