"""Links between what the wire shows and what Envoy says: access-log lines and moved cluster counters.

A packet finding explains the access-log lines that carry one of its response flags, name its server as their
upstream host, and started around the same time. A line with a failure flag that no packet finding explains
becomes an ``access-log`` finding of its own after a grace period, with the flag's meaning and what to
capture next (Envoy access-log docs, %RESPONSE_FLAGS%).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import flag

from .findings import Evidence, Finding, FlowRef, Severity

FAILURE_FLAGS = frozenset({"UC", "UF", "UPE", "URX", "UH", "UT", "UR", "UO", "LR", "DPE", "NR", "DC"})
WINDOW_S = 3.0  # how far a line's request may start before, or end after, the packet that decided
GRACE_S = 5.0  # how long a failing line waits for a packet finding before it is reported on its own
MAX_LINES = 10_000

_NEXT_CAPTURE = {
    "UC": "capture lo while it happens: a request from 127.0.0.6 on an idle pooled connection answered by the "
          "app's RST (with or without a FIN before it) is stale-keepalive; on eth0, a challenge ACK before it is "
          "tuple-collision",
    "UF": "capture lo: a SYN from 127.0.0.6 answered by RST means nothing listens on the app port; no answer "
          "means drops; on the caller's side, capture eth0 for challenge ACKs (tuple-collision)",
    "URX": "the retries were spent: look for the failure of each attempt (UF, UC) in the same window",
    "UPE": "capture lo: the app's response headers show which framing rule (RFC 9112 section 6) it breaks",
    "UH": "no healthy endpoint: check the cluster's hosts in /clusters (health_flags) and the endpoints",
    "UT": "the route timeout fired: compare the access log's duration with the app's response time on lo",
}


def _server_of(entry: AccessLogEntry) -> str | None:
    return entry.upstream_host or entry.downstream_local


def access_log_flow(entry: AccessLogEntry) -> FlowRef:
    """The connection an access-log line speaks of: the caller (%DOWNSTREAM_REMOTE_ADDRESS%) and the app it
    was for (%UPSTREAM_HOST%, else %DOWNSTREAM_LOCAL_ADDRESS%); no interface (it was not seen on one)."""
    return FlowRef(entry.downstream_remote or "-", _server_of(entry) or "-", "")


def explains(f: Finding, entry: AccessLogEntry) -> bool:
    """Whether finding ``f`` explains access-log line ``entry``: a shared response flag, the same server, and
    the request running within WINDOW_S of the finding's evidence. When the line names the finding's connection,
    it must be the finding's own, so Envoy's line and the packets speak of the same four-tuple: on ``lo`` (the
    sidecar's upstream leg) the flow's client is the line's %UPSTREAM_LOCAL_ADDRESS%, on ``eth0`` the caller's
    %DOWNSTREAM_REMOTE_ADDRESS%."""
    # The same response flag, or, where Envoy sets none (403 upgrade_failed), the same details.
    if not set(entry.flags) & set(f.envoy_flags) and not (f.response_code_details
                                                           and f.response_code_details == entry.details):
        return False
    times = [e.ts for e in f.evidence if e.ts] or [f.ts]
    end = entry.ts + entry.duration_ms / 1000.0
    if end < min(times) - WINDOW_S or entry.ts > max(times) + WINDOW_S:
        return False
    own = {"lo": entry.upstream_local, "eth0": entry.downstream_remote}.get(f.flow.iface)
    if own is not None and own != f.flow.client:
        return False
    return _server_of(entry) in (f.flow.server, None)


# A detector's reading of an access-log line no packet finding explains (Detector.from_access_log): the
# line, and the evidence that names it. None when the line is not that detector's.
Claim = Callable[[AccessLogEntry, Evidence], "Finding | None"]



def log_line_summary(entry: AccessLogEntry) -> str:
    """What an access-log line says, in short, for evidence: ``access log: 503 UF,URX upstream_reset...``."""
    return f"access log: {entry.code} {','.join(entry.flags) or '-'} {entry.details or ''}".rstrip()

class Correlator:
    """Keeps the recent access-log lines (bounded) and matches them to findings. Each line is decided once:
    explained by a finding, claimed by a detector that reads it, or reported on its own; the decision lives
    and goes with the line."""

    def __init__(self, pod: str | None = None, source: str = "istio-proxy log") -> None:
        self.pod = pod
        self.source = source
        self._lines: deque[list] = deque(maxlen=MAX_LINES)  # [line number, entry, decided, source]
        self._next_line = 1

    def add(self, entry: AccessLogEntry, source: str | None = None, line: int = 0) -> None:
        """Keep ``entry``; ``source`` and ``line`` (1-based) name where it was read (a file offline); by
        default the followed log and the order lines came in."""
        self._lines.append([line or self._next_line, entry, False, source or self.source])
        self._next_line += 1

    def entries(self) -> list[AccessLogEntry]:
        """The lines kept (the newest MAX_LINES), in log order."""
        return [line[1] for line in self._lines]

    def lines_for(self, f: Finding) -> list[tuple[int, AccessLogEntry]]:
        """The access-log lines ``f`` explains, in log order."""
        if not f.envoy_flags and not f.response_code_details:
            return []
        return [(line[0], line[1]) for line in self._lines if explains(f, line[1])]

    def attach(self, f: Finding) -> Finding:
        """``f`` with the raw lines it explains (marked, so they are not reported again on their own)."""
        if not f.envoy_flags and not f.response_code_details:
            return f
        matched = [line for line in self._lines if explains(f, line[1])]
        if not matched:
            return f
        for line in matched:
            line[2] = True
        return replace(f, access_log=tuple(line[1].raw for line in matched))

    def unexplained(self, now: float | None, findings: list[Finding], claims: Sequence[Claim] = ()) -> list[Finding]:
        """Findings for the lines older than GRACE_S (all, when ``now`` is None) that no finding in ``findings``
        explains: the first of ``claims`` (the detectors that read access-log lines) that makes one of the
        line, else, for a line with a failure flag, an ``access-log`` finding. Only lines not yet decided are
        checked against the findings, so a tick costs a scan of the kept lines, not findings x lines."""
        out = []
        # A line without a failure flag can only be explained by its details (explains): those findings alone
        # are worth checking it against, and a busy pod's log is mostly such lines.
        by_details = [f for f in findings if not f.envoy_flags and f.response_code_details] if claims else []
        for line in self._lines:
            n, entry, decided, source = line
            if decided or (now is not None and now - entry.ts < GRACE_S):
                continue
            failing = bool(set(entry.flags) & FAILURE_FLAGS)
            if not failing and not claims:
                continue
            line[2] = True
            if any(explains(f, entry) for f in (findings if failing else by_details)):
                continue  # a finding of the wire (or of an earlier line) speaks of it already
            # The line itself goes to access_log, once; the evidence names it by what it says.
            evidence = Evidence(source, "", n, entry.ts, log_line_summary(entry))
            claimed = next((f for f in (claim(entry, evidence) for claim in claims) if f is not None), None)
            if claimed is not None:
                out.append(replace(claimed, access_log=claimed.access_log or (entry.raw,)))
            elif failing:
                out.append(self._finding(evidence, entry))
        return out

    def _finding(self, evidence: Evidence, entry: AccessLogEntry) -> Finding:
        flags = [flag(s) for s in entry.flags]
        meanings = "; ".join(f"{fl.short} ({fl.long or 'unknown flag'}): {fl.meaning}" for fl in flags)
        nxt = next((_NEXT_CAPTURE[s] for s in entry.flags if s in _NEXT_CAPTURE),
                   "capture lo and eth0 while it happens (kubectl meshdoctor watch)")
        flow = access_log_flow(entry)
        server = flow.server
        request = f"{entry.method} {entry.path}" if entry.method else "a TCP connection"
        return Finding(
            detector="access-log",
            severity=Severity.ERROR if entry.code >= 500 or entry.code == 0 else Severity.WARNING,
            title=f"Envoy logged {','.join(entry.flags)} ({entry.code}) for {server} with no packet evidence",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=tuple(entry.flags),
            variant=f"{','.join(entry.flags)} ({entry.code}) without packet evidence",
            response_code_details=entry.details or "",
            explanation=(f"The sidecar answered {request} with {entry.code} and response flags "
                         f"{','.join(entry.flags)}: {meanings}. No packet in the capture explains it (the failure "
                         f"may lie outside the captured interfaces or before the capture started)."),
            remediation=f"# What to capture next: {nxt}.",
            pod=self.pod,
            ts=entry.ts,
            access_log=(entry.raw,),
        )


# The inbound-cluster stats real Envoy (1.40, the lab's sidecar) moves for an access-log line's response flag:
# what backs an ``access-log`` finding. Packet findings take theirs from their detector's ``envoy_counters``.
FLAG_COUNTERS: dict[str, tuple[str, ...]] = {
    "UC": ("upstream_cx_destroy_remote_with_active_rq",),
    "UF": ("upstream_cx_connect_fail", "upstream_rq_pending_failure_eject"),
    "UPE": ("upstream_cx_protocol_error",),
}


def attach_counters(findings: list[Finding], moved: dict[str, dict[str, int]],
                    backs: dict[str, tuple[str, ...]],
                    backed: Callable[[Finding], bool] = lambda f: True) -> list[Finding]:
    """Each finding with the Envoy cluster counters that back it and moved during the run on the inbound cluster
    of its server port (``inbound|<port>||``). ``moved`` is cluster -> stat -> delta; ``backs`` is detector id ->
    the stats that back its findings (Detector.envoy_counters); an ``access-log`` finding is backed by the
    stats of its flags (FLAG_COUNTERS). A finding ``backed`` says no to (its detector's ``backed_by_counters``:
    a warning that no failure happened yet, such as tuple-collision's exposure) gets none. Counters that moved for other reasons stay in the report's
    run-wide ``envoy.counters_moved``."""
    out = []
    for f in findings:
        if not backed(f):  # a warning of no failure (an exposure): a failure's counters would belie it
            out.append(f)
            continue
        port = f.flow.server.rsplit(":", 1)[-1]
        counters = moved.get(f"inbound|{port}||", {}) if port.isdigit() else {}
        names = backs.get(f.detector, ()) if f.detector != "access-log" else tuple(
            n for flag_name in f.envoy_flags for n in FLAG_COUNTERS.get(flag_name, ()))
        backing = {f"cluster.inbound|{port}||.{n}": counters[n] for n in names if counters.get(n)}
        out.append(replace(f, counters={**f.counters, **backing}) if backing else f)
    return out


def attach_kernel_counters(findings: list[Finding], deltas: dict[str, int], backs: dict[str, tuple[str, ...]],
                           backed: Callable[[Finding], bool] = lambda f: True) -> list[Finding]:
    """Each finding with the kernel counters (nstat names, e.g. ``TcpExtTCPChallengeACK``) that back its
    detector and moved during the run. ``deltas`` is counter -> delta; ``backs`` is detector id -> the
    counters it declares (Detector.kernel_counters)."""
    out = []
    for f in findings:
        if not backed(f):  # as attach_counters: a finding of no failure is backed by no failure's counters
            out.append(f)
            continue
        backing = {f"kernel.{n}": deltas[n] for n in backs.get(f.detector, ()) if n in deltas}
        out.append(replace(f, counters={**f.counters, **backing}) if backing else f)
    return out
