"""A finding of Envoy's logs alone whose request lies outside the span of the captures given beside the log.

An istio-proxy log (``kubectl logs``) covers the container's whole life; a capture (``watch --write-pcap``) only
the seconds it ran. A failing line from before (or after) the capture is a finding of the log alone, and its
detector, which cannot know a capture was given, advises capturing the pod's lo and eth0: the user did, over
another span. So analyze says when such a finding's request was, against the span the captures cover, and
replaces the advice to capture with that: the captures could not show it, the problem with packet evidence is
what they show. A finding inside the span keeps its detector's words (the captures hold no packet of it: the
failure lies elsewhere, as it says).
"""

from __future__ import annotations

import time
from dataclasses import replace

from kubectl_meshdoctor.core.findings import Finding, Problem
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def _request_end(f: Finding) -> float:
    """When the request of ``f`` ended: its access-log line's START_TIME plus its DURATION (ms), when parsed."""
    durations = [e.duration_ms for e in f.entries if e is not None and getattr(e, "duration_ms", None)]
    return f.ts + max(durations, default=0) / 1000.0


def outside_capture(findings: list[Finding], stats: PipelineStats) -> list[Finding]:
    """``findings`` (one pod's) with each finding that stands on no packet and whose request (``ts`` to the end
    its access-log line gives) lies wholly outside the span of the pod's captures (``stats.by_iface``: the first
    and last packet read of each interface) told so: a sentence before its explanation, a remediation that names
    the span instead of asking for a capture, and ``details["outside_capture"]`` (``before_s`` or ``after_s``:
    seconds between the request and the span; ``span``: its first and last packet, seconds since the epoch).
    Unchanged when no capture of the pod held a packet."""
    firsts = [s.first_ts for s in stats.by_iface.values() if s.packets and s.first_ts is not None]
    lasts = [s.last_ts for s in stats.by_iface.values() if s.packets and s.last_ts is not None]
    if not firsts or not lasts:
        return findings
    first, last = min(firsts), max(lasts)
    ifaces = ", ".join(sorted(i for i, s in stats.by_iface.items() if s.packets))
    with_packets = {f.detector for f in findings if "packets" in f.stands_on}
    out: list[Finding] = []
    for f in findings:
        end = _request_end(f)
        if "packets" in f.stands_on or f.connection is None or first <= end and f.ts <= last:
            out.append(f)
            continue
        gap = first - end if end < first else f.ts - last
        side = "before the captures given began" if end < first else "after the captures given ended"
        span = f"{ifaces}: {_clock(first)} to {_clock(last)} UTC"
        said = (f"This request was logged at {_clock(f.ts)} UTC, {gap:.1f} s {side} ({span}): they hold none of "
                f"its packets, so only the log tells of it. ")
        remediation = (f"# No fix from this line alone: it is outside the captures given\n# ({span}),\n"
                       f"# which could not show its cause.")
        if f.detector in with_packets:
            remediation += (f"\n# The {f.detector} problem with packet evidence in this report is what they show, "
                            f"with its fix.")
        key = "before_s" if end < first else "after_s"
        out.append(replace(f, explanation=said + f.explanation, remediation=remediation, fixes=(),
                           details={**f.details, "outside_capture": {key: round(gap, 3),
                                                                     "span": [round(first, 6), round(last, 6)]}}))
    return out


def context_problems(pipeline: Pipeline, logs: list[str]) -> list[Problem]:
    """The report's line on the failing access-log lines of ``logs`` (their paths) read as context, not judged
    (core/correlate.py: requests across an edge of the captures' span), as watch says it; none when none was."""
    note = pipeline.correlator.before_capture_note()
    return [Problem(", ".join(logs), note)] if note is not None and logs else []
