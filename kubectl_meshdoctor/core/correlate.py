"""Links between what the wire shows and what Envoy says: access-log lines, the stories of Envoy's debug log,
and moved cluster counters.

A packet finding explains the access-log lines (and debug-log stories) that carry one of its response flags,
name its server as their upstream host, and started around the same time. A request Envoy logged with a failure
flag that no packet finding explains goes to the detectors that read Envoy's logs, else becomes an
``access-log`` finding of its own after a grace period, with the flag's meaning and what to capture next
(Envoy access-log docs, %RESPONSE_FLAGS%). The access-log line and the debug-log story of one request are one
request: joined by x-request-id, they are decided together and quoted together.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.flags import flag
from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster
from kubectl_meshdoctor.envoy.stats import scoped
from kubectl_meshdoctor.envoy.story import StreamStory

from .capture_edges import context_note, edge, packet_caused
from .findings import ENVOY_LOG, PACKET, Evidence, Finding, FlowRef, Severity
from .hop_pairs import logged_entries
from .hop_path import DOWNSTREAM_FLAGS
from .remedies import capture_next
from .unseen import IfaceStats

# The flags of a request Envoy failed or refused (envoy/flags.py): fault injection (FI, DI) is asked for, the rest
# is a failure a user meets, a 4xx among them a warning (rate limited, denied by an external authorizer).
FAILURE_FLAGS = frozenset({"UC", "UF", "UPE", "URX", "UH", "UT", "UR", "UO", "LR", "DPE", "NR", "DC", "RL", "UAEX",
                           "RLSE", "SI", "NC", "OM", "DT", "UMSDR", "IH", "LH", "UDO", "DF", "DR"})


def envoys_own_5xx(entry: AccessLogEntry) -> bool:
    """A 5xx no upstream answered and no flag names: no response flag, no %UPSTREAM_HOST%, details (when the
    format has them) other than ``via_upstream``. A filter's local reply before any upstream was picked (Istio's
    Mixer policy check, 1.0 - 1.4, answered 503 so, istio/istio#8692), which is a failure a user meets."""
    return (entry.code >= 500 and not entry.flags and entry.upstream_host is None
            and entry.details != "via_upstream")


WINDOW_S = 3.0  # how far a line's request may start before, or end after, the packet that decided
# The same for a line that names no connection to hold the packets to (a failed connect's UF has no
# %UPSTREAM_LOCAL_ADDRESS%): the packets of its request lie within the request's own span, which Envoy logs to
# the millisecond on the clock the pod's capture also reads; wider, a periodic caller's neighbouring requests
# (every 2 s in a watch of the lab's refused pod) were each attached to every refused connect.
UNPINNED_WINDOW_S = 0.25
GRACE_S = 5.0  # how long a failing line waits for a packet finding before it is reported on its own
MAX_LINES = 10_000



def _server_of(entry: AccessLogEntry) -> str | None:
    return entry.upstream_host or entry.downstream_local


def access_log_flow(entry: AccessLogEntry) -> FlowRef:
    """The connection an access-log line speaks of: the caller (%DOWNSTREAM_REMOTE_ADDRESS%) and the app it
    was for (%UPSTREAM_HOST%, else %DOWNSTREAM_LOCAL_ADDRESS%, else the cluster it was routed to, as Envoy's
    debug log may name no address, else the request's :authority); no interface (it was not seen on one). A
    caller sidecar's line of its upstream side (an outbound cluster, no downstream flag) speaks of its connection
    to the next pod:
    %UPSTREAM_LOCAL_ADDRESS% (Envoy's "local address of the upstream connection"), for its
    %DOWNSTREAM_REMOTE_ADDRESS% is its own client's socket on the pod's lo, which never crossed eth0."""
    client = entry.downstream_remote
    cluster = parse_istio_cluster(entry.upstream_cluster)
    if (entry.upstream_local and cluster is not None and cluster.direction == "outbound"
            and not set(entry.flags) & DOWNSTREAM_FLAGS):
        client = entry.upstream_local
    return FlowRef(client or "-", _server_of(entry) or entry.upstream_cluster or entry.authority or "-", "")


def explains(f: Finding, entry: AccessLogEntry) -> bool:
    """Whether finding ``f`` explains access-log line ``entry``: the request running within WINDOW_S of the
    finding's evidence, and either on the finding's own connection (the line's upstream leg, its
    %UPSTREAM_LOCAL_ADDRESS% to %UPSTREAM_HOST%, is the finding's four-tuple) with a failure flag of any kind, or
    with a shared response flag and the same server. When the line names the finding's connection, it must be the
    finding's own, so Envoy's line and the packets speak of the same four-tuple: on ``lo`` (the sidecar's upstream
    leg) the flow's client is the line's %UPSTREAM_LOCAL_ADDRESS%, on ``eth0`` the caller's
    %DOWNSTREAM_REMOTE_ADDRESS% at the pod it reached or, for the caller's own line (its upstream another pod's),
    its %UPSTREAM_LOCAL_ADDRESS%: the caller's %DOWNSTREAM_REMOTE_ADDRESS% is its own client's, on its lo."""
    times = [e.ts for e in f.evidence if e.ts] or [f.ts]
    end = entry.ts + entry.duration_ms / 1000.0
    if end < min(times) - WINDOW_S or entry.ts > max(times) + WINDOW_S:
        return False
    if upstream_leg_of(f, entry):
        # The packets show what became of the very connection the request was on: whatever flag Envoy gave it
        # (a caller's 503 UC for the connection the pod reset unread) is this finding's effect.
        return bool(set(entry.flags) & FAILURE_FLAGS)
    # The same response flag, or, where Envoy sets none (403 upgrade_failed), the same details.
    if not set(entry.flags) & set(f.envoy_flags) and not (f.response_code_details
                                                           and f.response_code_details == entry.details):
        return False
    # A finding of no connection (NoFlow: counters) has no four-tuple of its own to hold the line to.
    own = _own_addresses(f, entry)
    if any(own) and f.flow.client not in own:
        return False
    window = UNPINNED_WINDOW_S if isinstance(f.flow, FlowRef) and not any(own) else WINDOW_S
    if end < min(times) - window or entry.ts > max(times) + window:
        return False
    return _server_of(entry) in (f.flow.server, None)


def upstream_leg_of(f: Finding, entry: AccessLogEntry) -> bool:
    """Whether the line's upstream connection (%UPSTREAM_LOCAL_ADDRESS% to %UPSTREAM_HOST%) is ``f``'s
    connection, on the interface it left by (lo for an inbound cluster's app, eth0 for another pod)."""
    flow = f.flow
    return (isinstance(flow, FlowRef) and flow.iface in ("lo", "eth0") and entry.upstream_local is not None
            and entry.upstream_local == flow.client and entry.upstream_host == flow.server)


def _own_addresses(f: Finding, entry: AccessLogEntry) -> tuple[str | None, ...]:
    iface = f.flow.iface if isinstance(f.flow, FlowRef) else ""
    if iface == "lo":
        return (entry.upstream_local,)
    if iface != "eth0":
        return ()
    direction = parse_istio_cluster(entry.upstream_cluster)
    if direction is not None and direction.direction == "inbound":
        return (entry.downstream_remote,)  # the server pod's line: its downstream came in on eth0
    if entry.upstream_cluster is not None:
        # The caller's own line (an outbound or passthrough cluster): its upstream leg left by eth0; "-" for a
        # request that got no connection (a connect failure) names none of its own.
        return (entry.upstream_local,)
    return (entry.downstream_remote, entry.upstream_local)


# A detector's reading of a request Envoy logged that no packet finding explains: the access-log line (or, for a
# request only Envoy's debug log tells of, the line Envoy would have written), its debug-log story (None when
# there is none), and the evidence that names the first of their lines. None when the request is not that
# detector's (Detector.from_access_log, Detector.from_envoy_log).
Claim = Callable[[AccessLogEntry, "StreamStory | None", Evidence], "Finding | None"]
JOIN_S = 1.0  # a story and an access-log line with no x-request-id to join them: their ends this close in time
JOIN_SCAN = 256  # records looked back over for such a join


def of_the_wire(f: Finding) -> bool:
    """A finding that rests on packets: the one kind that explains a logged request without being its own; a
    finding of another line (the same class a second before) does not make this one's line any less its own."""
    return any(e.kind == PACKET for e in f.evidence)


def log_line_summary(entry: AccessLogEntry) -> str:
    """What an access-log line says, in short, for evidence: ``access log: 503 UF,URX upstream_reset...``."""
    return f"access log: {entry.code} {','.join(entry.flags) or '-'} {entry.details or ''}".rstrip()


def story_evidence(story: StreamStory) -> tuple[Evidence, ...]:
    """The debug-log lines a story rests on, as evidence (kind ENVOY_LOG, ``frame`` the line number)."""
    return tuple(Evidence.log_line(r.source, r.line, r.ts or 0.0, f"envoy log: {r.text}", ENVOY_LOG)
                 for r in story.refs)


@dataclass(slots=True, eq=False)
class _Record:
    """One request as Envoy logged it: an access-log line (``story`` None) or a debug-log story (``raw`` empty).
    ``partner``: the other record of the same request, when both were read; ``decided``: explained, claimed or
    reported already (for both of a pair at once)."""

    n: int
    entry: AccessLogEntry
    source: str
    story: StreamStory | None = None
    partner: "_Record | None" = None
    decided: bool = False

    @property
    def end(self) -> float:
        return self.entry.ts + self.entry.duration_ms / 1000.0


class Correlator:
    """Keeps the recent requests Envoy logged (bounded), access-log lines and debug-log stories, joins the two of
    one request (x-request-id, else time and details), and matches them to findings. Each request is decided
    once: explained by a finding, claimed by a detector that reads it, or reported on its own."""

    def __init__(self, pod: str | None = None, source: str = "istio-proxy log", redact: bool = True,
                 by_iface: Mapping[str, IfaceStats] | None = None) -> None:
        self.pod = pod
        self.redact = redact  # hide the credentials a line carries where it is quoted (--no-redact: show them)
        self.source = source
        self._lines: deque[_Record] = deque(maxlen=MAX_LINES)
        self._by_request: dict[str, _Record] = {}
        self._evicted: list[_Record] = []  # left the window undecided: the pipeline has them decided at once
        self._next_line = 1
        self.kept = 0  # requests kept so far (lines and stories), evicted or not: what a live view has seen
        # A live run's capture start (CaptureStartEvent): a failing request that began earlier is context, counted
        # in before_capture, not judged: no packet of it could be seen, nor, across pods, the other hop's line.
        self.judged_from: float | None = None
        # A live run whose capture has not begun yet (await_capture): a request decided now began before it did.
        self.capture_pending = False
        self.before_capture = 0
        # The pod's packets read so far (PipelineStats.by_iface), a live capture's stop: a line across either is context
        self.by_iface: Mapping[str, IfaceStats] = by_iface if by_iface is not None else {}
        self._told = by_iface is not None  # whether "no packet read" can be said
        self.judged_until: float | None = None
        self.after_capture = 0

    def await_capture(self) -> None:
        """A live run's capture is to begin: until its start is known (CaptureStartEvent), one decided began before."""
        self.capture_pending = True

    def before_capture_note(self) -> str | None:
        """The line on the failing lines read as context (``before_capture``, ``after_capture``), for the report's
        problems and a live screen's (core/capture_edges.context_note); None when there were none."""
        return context_note(self.before_capture, self.after_capture,
                            self.judged_from is not None or self.capture_pending)

    def add(self, entry: AccessLogEntry, source: str | None = None, line: int = 0) -> None:
        """Keep access-log line ``entry``; ``source`` and ``line`` (1-based) name where it was read (a file
        offline); by default the followed log and the order lines came in."""
        self._keep(_Record(line or self._next_line, entry, source or self.source))
        self._next_line += 1

    def add_story(self, story: StreamStory) -> None:
        """Keep a request Envoy's debug log tells of; only a failed one can need explaining."""
        if story.failed:
            first = story.refs[0].line if story.refs else 0
            self._keep(_Record(first, story.entry(), story.source, story))

    def _keep(self, rec: _Record) -> None:
        self.kept += 1
        if len(self._lines) == self._lines.maxlen:
            old = self._lines[0]
            if self._by_request.get(old.entry.request_id or "") is old:
                del self._by_request[old.entry.request_id or ""]
            if not old.decided:
                self._evicted.append(old)
        self._join(rec)
        self._lines.append(rec)

    def _join(self, rec: _Record) -> None:
        """Pair ``rec`` with the record of the same request of the other kind, if one was kept: by x-request-id,
        else, among the last JOIN_SCAN records, by details, time and caller."""
        rid = rec.entry.request_id
        other = self._by_request.get(rid) if rid else None
        if other is not None and (other.partner is not None or (other.story is None) == (rec.story is None)):
            other = None
        if other is None:
            recent = list(itertools.islice(reversed(self._lines), JOIN_SCAN))
            other = next((o for o in recent if self._same_request(rec, o)), None)
        if other is not None:
            rec.partner, other.partner = other, rec
            rec.decided = other.decided
        elif rid and rid not in self._by_request:
            self._by_request[rid] = rec

    @staticmethod
    def _same_request(a: _Record, b: _Record) -> bool:
        """Records of the other kind, not paired yet, with no request id to go by: the same details, ends within
        JOIN_S, the same caller where both name one."""
        if b.partner is not None or (a.story is None) == (b.story is None):
            return False
        if a.entry.request_id and b.entry.request_id:
            return False  # both have an id, and they differ (the same one was looked up first)
        if (a.entry.details or "") != (b.entry.details or "") or abs(a.end - b.end) > JOIN_S:
            return False
        ra, rb = a.entry.downstream_remote, b.entry.downstream_remote
        return ra is None or rb is None or ra == rb

    def earliest_since(self, kept: int) -> float | None:
        """The earliest start (seconds since the epoch) of the requests kept after the first ``kept`` of them (a
        ``kept`` read before), or None when none was: the findings a newer line can be attached to end no earlier
        than WINDOW_S before it (explains)."""
        new = min(self.kept - kept, len(self._lines))
        if new <= 0:
            return None
        return min(r.entry.ts for r in itertools.islice(reversed(self._lines), new))

    def entries_count(self) -> int:
        """How many access-log lines are kept: len(entries()) without building the list."""
        return sum(r.story is None for r in self._lines)

    def entries(self) -> list[AccessLogEntry]:
        """The access-log lines kept (the newest MAX_LINES), in log order."""
        return [r.entry for r in self._lines if r.story is None]

    def answers(self, min_code: int = 500) -> list[tuple[AccessLogEntry, str, Evidence]]:
        """The access-log lines kept whose response code is ``min_code`` or more: each parsed, as quoted, and
        the evidence naming it."""
        return [(r.entry, r.entry.quoted(self.redact),
                 Evidence.log_line(r.source, r.n, r.entry.ts, log_line_summary(r.entry)))
                for r in self._lines if r.story is None and r.entry.code >= min_code]

    def lines_for(self, f: Finding) -> list[tuple[int, AccessLogEntry]]:
        """The access-log lines ``f`` explains, in log order."""
        if not f.envoy_flags and not f.response_code_details:
            return []
        return [(r.n, r.entry) for r in self._lines if r.story is None and explains(f, r.entry)]

    def attach(self, f: Finding) -> Finding:
        """``f`` with the raw access-log lines and the debug-log lines of the requests it explains (marked, so
        they are not reported again on their own)."""
        if not f.envoy_flags and not f.response_code_details or not of_the_wire(f):
            return f  # a finding of a logged request carries its own lines already, and explains no other's
        # A story joined to its access-log line is matched by the line, which names more (the upstream connection's
        # local address, that a story lacks): a neighbour's story must not bring its line in by the back door.
        matched = [r for r in self._lines
                   if explains(f, r.partner.entry if r.story is not None and r.partner is not None else r.entry)]
        if not matched:
            return f
        pairs = list(dict.fromkeys(x for r in matched for x in (r, r.partner) if x is not None))
        for r in pairs:
            r.decided = True
        debug = tuple(ref.raw or ref.text for r in pairs if r.story is not None for ref in r.story.refs)
        return replace(f.with_lines((r.entry.quoted(self.redact), r.entry) for r in pairs if r.story is None),
                       envoy_log=f.envoy_log + tuple(x for x in debug if x not in f.envoy_log))

    def unexplained(self, now: float | None, findings: list[Finding], claims: Sequence[Claim] = ()) -> list[Finding]:
        """Findings for the requests older than GRACE_S (all, when ``now`` is None) that no finding in
        ``findings`` explains: the first of ``claims`` (the detectors that read Envoy's logs) that makes one of
        the request, else, for a request with a failure flag, an ``access-log`` finding. A request read from both
        logs is decided once, on the access-log line, with the debug-log lines as further evidence. Only
        requests not yet decided are checked, so a tick costs a scan of the kept ones, not findings x lines."""
        wire = [f for f in findings if of_the_wire(f)]  # the only findings that explain a line not their own
        by_details = self._by_details(wire, claims)
        decided = (self._decide(rec, wire, claims, by_details, now) for rec in self._lines
                   if not rec.decided and (now is None or now - rec.entry.ts >= GRACE_S))
        return [f for f in decided if f is not None]

    @property
    def evicted(self) -> bool:
        """Whether requests left the bounded window before they were decided (decide_evicted takes them)."""
        return bool(self._evicted)

    def decide_evicted(self, findings: list[Finding], claims: Sequence[Claim] = ()) -> list[Finding]:
        """Decide now the requests the window let go undecided, as ``unexplained`` would have: a log longer than
        MAX_LINES read with no packet to tick on must lose none of its failures."""
        wire = [f for f in findings if of_the_wire(f)]
        by_details = self._by_details(wire, claims)
        out = [f for f in (self._decide(rec, wire, claims, by_details) for rec in self._evicted
                           if not rec.decided) if f is not None]
        self._evicted.clear()
        return out

    @staticmethod
    def _by_details(findings: list[Finding], claims: Sequence[Claim]) -> list[Finding]:
        # A line without a failure flag can only be explained by its details (explains): those findings alone
        # are worth checking it against, and a busy pod's log is mostly such lines.
        return [f for f in findings if not f.envoy_flags and f.response_code_details] if claims else []

    def _decide(self, rec: _Record, wire: list[Finding], claims: Sequence[Claim],
                by_details: list[Finding], now: float | None = None) -> Finding | None:
        """The finding of one request not decided yet, or None (explained already, or no failure, or, at a tick
        (``now``), a line still open at the latest packet read: left undecided, later packets may show its end)."""
        line = rec if rec.story is None else rec.partner
        story = rec.story if rec.story is not None else (rec.partner.story if rec.partner else None)
        entry = line.entry if line is not None else rec.entry
        failing = (bool(set(entry.flags) & FAILURE_FLAGS) or (story is not None and story.failed)
                   or envoys_own_5xx(entry))
        if not failing and not claims:
            return None
        # A line alone (no debug-log story, which tells of its own connection's end) is judged against packets
        # only: one across an edge of their span is context, as one from before the capture.
        across = (edge(self.by_iface, entry.ts, entry.duration_ms, self.judged_until)
                  if failing and story is None and line is not None and packet_caused(entry.flags) else None)
        if across == "after" and now is not None:
            return None
        rec.decided = True
        if rec.partner is not None:
            rec.partner.decided = True
        if self.capture_pending or self.judged_from is not None and entry.ts < self.judged_from and entry.ts:
            self.before_capture += failing
            return None
        if any(explains(f, entry) for f in (wire if failing else by_details)):
            return None  # a finding of the wire speaks of it already (and quotes it: attach)
        if across is not None:
            self.before_capture += across == "before"
            self.after_capture += across == "after"
            return None
        evidence = ((Evidence.log_line(line.source, line.n, entry.ts, log_line_summary(entry)),)
                    if line is not None else ()) + (story_evidence(story) if story is not None else ())
        if not evidence:
            return None
        claimed = next((f for f in (claim(entry, story, evidence[0]) for claim in claims) if f is not None), None)
        found = claimed if claimed is not None else self._finding(evidence[0], entry) if failing else None
        if found is None:
            return None
        more = tuple(e for e in evidence if e not in found.evidence)
        if not found.access_log and line is not None:
            found = found.with_lines([(entry.quoted(self.redact), entry)])
        return replace(found, evidence=found.evidence + more, pod=found.pod or entry.pod,
                       envoy_log=found.envoy_log or tuple(r.raw or r.text for r in (story.refs if story else ())))

    def _finding(self, evidence: Evidence, entry: AccessLogEntry) -> Finding:
        flags = [flag(s) for s in entry.flags]
        meanings = "; ".join(f"{fl.short} ({fl.long or 'unknown flag'}): {fl.meaning}" for fl in flags)
        remedy = capture_next(entry)
        no_packet = ("No capture was read with it, so no packet could show the cause"
                     if self._told and not any(s.packets for s in self.by_iface.values()) else
                     "No packet in the capture explains it (the failure may lie outside the captured interfaces or "
                     "before the capture started)")
        flow = access_log_flow(entry)
        server = flow.server
        request = f"{entry.method} {entry.path}" if entry.method else "a TCP connection"
        said = "Envoy's debug log tells of" if evidence.kind == ENVOY_LOG else "Envoy logged"
        local_reply = envoys_own_5xx(entry)
        shown = ",".join(entry.flags) or entry.details or ("a local reply" if local_reply else "a failure")
        return Finding(
            detector="access-log",
            # The caller going away (DC, DR) is the caller's doing, as a 4xx is: a warning.
            severity=(Severity.ERROR if (entry.code >= 500 or entry.code == 0)
                      and not (entry.flags and set(entry.flags) <= {"DC", "DR"}) else Severity.WARNING),
            title=f"{said} {shown} ({entry.code}) for {server} with no packet evidence",
            flow=flow,
            evidence=(evidence,),
            envoy_flags=tuple(entry.flags),
            variant=f"{shown} ({entry.code}) without packet evidence",
            response_code_details=entry.details or "",
            explanation=(f"The sidecar answered {request} with {entry.code}"
                         + (f" and response flags {','.join(entry.flags)}: {meanings}" if flags else "")
                         + (": no upstream host and no response flag, so the sidecar answered it itself before "
                            "any upstream was picked (a filter's local reply: a policy check such as Istio's "
                            "Mixer in 1.0 - 1.4, ext_authz, RBAC, a Wasm or Lua filter, a direct response); "
                            "Envoy's debug log (http and router at debug) names the filter"
                            if local_reply else "")
                         + f". {no_packet}."),
            remediation=remedy,
            pod=self.pod,
            ts=entry.ts,
            access_log=(entry.quoted(self.redact),) if entry.raw else (),
            entries=(entry,) if entry.raw else (),
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
                    backed: Callable[[Finding], bool] = lambda f: True,
                    stats: Mapping[str, int] | None = None) -> list[Finding]:
    """Each finding with the Envoy cluster counters that back it and moved during the run: on the inbound cluster
    of its server port (``inbound|<port>||``) and on the clusters its access-log lines name (%UPSTREAM_CLUSTER%:
    a caller's ``outbound|<port>||<host>``, where a DestinationRule's outlier detection and TLS act, and where
    real Envoy counts their failures). ``moved`` is cluster -> stat -> delta; ``backs`` is detector id -> the
    stats that back its findings (Detector.envoy_counters); an ``access-log`` finding is backed by the stats of
    its flags (FLAG_COUNTERS). A finding ``backed`` says no to (its detector's ``backed_by_counters``: a warning
    that no failure happened yet, such as tuple-collision's exposure) gets none. Counters that moved for other
    reasons stay in the report's run-wide ``envoy.counters_moved``. A backing stat named ``http.STAT`` or
    ``listener.STAT`` is looked up in ``stats`` (every stat that moved, by its full name): the HCM's of the
    finding's server port, any listener's (virtualInbound's ``no_filter_chain_match``)."""
    out = []
    for f in findings:
        if not backed(f):  # a warning of no failure (an exposure): a failure's counters would belie it
            out.append(f)
            continue
        names = backs.get(f.detector, ()) if f.detector != "access-log" else tuple(
            n for flag_name in f.envoy_flags for n in FLAG_COUNTERS.get(flag_name, ()))
        backing = {f"cluster.{cluster}.{n}": moved[cluster][n]
                   for cluster in clusters_of(f) if cluster in moved for n in names if moved[cluster].get(n)}
        port = f.flow.server.rsplit(":", 1)[-1]
        for n in names:
            scope, _, stat = n.partition(".")
            if scope in ("http", "listener") and stats:
                backing.update({f"{scope}.{owner}.{stat}": v for owner, v in scoped(stats, scope, stat).items()
                                if scope == "listener" or owner.endswith(f"_{port}")})
        out.append(replace(f, counters={**f.counters, **backing}) if backing else f)
    return out


def clusters_of(f: Finding) -> list[str]:
    """The clusters finding ``f`` speaks of: its server port's inbound cluster, then those its lines name."""
    port = f.flow.server.rsplit(":", 1)[-1]
    named = [entry.upstream_cluster for entry in logged_entries(f) if entry.upstream_cluster]
    inbound = [f"inbound|{port}||"] if port.isdigit() else []
    return list(dict.fromkeys(inbound + named))


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
