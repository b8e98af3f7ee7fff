"""The core: events in, findings out. Knows nothing of where packets come from or where findings go."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.story import STORY_LOGGERS, StoryBuilder, StreamStory

from .correlate import (
    WINDOW_S,
    Claim,
    Correlator,
    attach_counters,
    attach_kernel_counters,
    clusters_of,
    logged_entries,
    of_the_wire,
)
from .detector import ALL_KINDS, Detector, DetectorContext, kinds_mask
from .events import (
    AccessLogEvent,
    CaptureStartEvent,
    ClustersEvent,
    ContextEvent,
    EnvoyCountersEvent,
    EnvoyLogEvent,
    KernelCountersEvent,
    PacketEvent,
    PodEvent,
    RedirectMapEvent,
)
from .findings import Evidence, Finding, Severity
from .flows import FlowTable
from .hop_pairs import direction
from .hop_path import own_addresses, with_end
from .hops import LoggedLine, join_hops
from .pod_history import attach_sidecar_runs
from .redact import redact_finding
from .registry import load_detectors
from .unseen import IfaceStats, Missed, missed_by
from .upstream_pod import ip_of

TICK_EVERY_S = 0.5  # packet time between detector ticks (silence-based conclusions such as unanswered SYNs)
MAX_FINDINGS = 10_000
MAX_LO_ADDRESSES = 16  # a pod's own addresses and loopback's: a capture called lo holding more is not one


@dataclass(slots=True)
class PipelineStats:
    """Counts for the report and the TUI header. Times in seconds since the epoch. ``missed``: the failure classes
    the run's detectors read on one interface only (their ``unseen_without``), for what the report says a pod
    whose packets came from one of lo and eth0 could not show (core/unseen.py)."""

    packets: int = 0
    by_iface: dict[str, IfaceStats] = field(default_factory=dict)
    flows_seen: int = 0
    findings_dropped: int = 0
    frames_read: dict[str, int] = field(default_factory=dict)  # stream -> frames tshark read (filtered or not)
    missed: tuple[Missed, ...] = ()

    @property
    def duration_s(self) -> float:
        firsts = [s.first_ts for s in self.by_iface.values() if s.first_ts is not None]
        lasts = [s.last_ts for s in self.by_iface.values() if s.last_ts is not None]
        return round(max(lasts) - min(firsts), 6) if firsts and lasts else 0.0


class Pipeline:
    """Feeds packets through the flow table and every detector; collects findings.

    ``on_finding`` is called for each finding as it is concluded (the TUI and the live front ends subscribe); all
    findings are also kept (up to MAX_FINDINGS) for the final report. ``keep_recent`` keeps that many of the latest
    packets in ``recent`` for a front end's packets pane (bounded: memory stays flat).
    """

    def __init__(self, detectors: Iterable[Detector], ctx: DetectorContext,
                 on_finding: Callable[[Finding], None] | None = None, keep_recent: int = 0) -> None:
        self.ctx = ctx
        self.detectors = list(detectors)
        self.findings: list[Finding] = []
        # Those of them that rest on packets: the only ones that explain a logged request not their own, kept apart
        # so that deciding each request costs a scan of these, not of every finding (a log of 40,000 failing
        # requests made 40,000 findings).
        self._wire: list[Finding] = []
        # by_iface is the context's: the detectors read which interfaces' packets came so far (core/unseen.captured).
        self.stats = PipelineStats(by_iface=ctx.by_iface, missed=missed_by(
            (d.id, d.unseen_rank, d.unseen_without) for d in self.detectors))
        self._on_finding = on_finding
        self.correlator = Correlator(ctx.pod, redact=ctx.redact, by_iface=ctx.by_iface)
        self._next_tick: float | None = None
        self.recent: deque[PacketEvent] = deque(maxlen=keep_recent)
        self._envoy_moved: dict[str, dict[str, int]] = {}
        # The detectors that read Envoy's logs on their own (those that override from_access_log or
        # from_envoy_log): a request of the debug log goes to from_envoy_log, a line alone to from_access_log.
        self._claims = [_claim(d) for d in self.detectors
                        if type(d).from_access_log is not Detector.from_access_log
                        or type(d).from_envoy_log is not Detector.from_envoy_log]
        self._kernel_moved: dict[str, int] = {}
        # interface -> (its IfaceStats, for each packet kind mask the detectors its packets go to)
        self._reading: dict[str, tuple[IfaceStats, tuple[tuple[Detector, ...], ...]]] = {}
        self._pods: list[PodEvent] = []  # the pod as read at the start, and at the end when read again
        self._stories: dict[tuple[str, str | None], StoryBuilder] = {}  # per Envoy: its log's source, its pod
        self._counters: EnvoyCountersEvent | None = None
        # After finish: the 5xx answers the sidecar logged that no finding quotes, for the other hop's finding
        self.logged: tuple[LoggedLine, ...] = ()
        # The addresses of the SYNs seen on lo, the pod's own (its sidecar's REDIRECTed and 127.0.0.6 connections):
        # they tell which end of an eth0 connection it is. A SYN is captured after nat OUTPUT rewrote its
        # destination to a local one (REDIRECT); later segments' replies show the original destination again.
        self._on_lo: set[str] = set()
        self.emitted = 0  # findings concluded so far, kept or not: each one on_finding was called with
        self.finished = False
        # so_far's: self.findings[i] with the lines it explains, and the correlator's count when they were attached
        self._attached: list[Finding] = []
        self._attached_kept = 0
        self._info_slots: deque[int] = deque()  # where in self.findings the info findings are, oldest first

    @classmethod
    def with_detectors(cls, only: Iterable[str] | None = None, pod: str | None = None,
                       on_finding: Callable[[Finding], None] | None = None, redact: bool = True,
                       keep_recent: int = 0) -> "Pipeline":
        """A pipeline with a fresh flow table and the detectors found by the registry (all, or ``only``)."""
        ctx = DetectorContext(flows=FlowTable(), pod=pod, redact=redact)
        return cls(load_detectors(ctx, only), ctx, on_finding, keep_recent)

    def envoy_loggers(self) -> tuple[str, ...]:
        """The Envoy loggers whose debug lines this pipeline's detectors read: those each declares
        (Detector.envoy_loggers), and, when any detector reads Envoy's requests (a claim), those a request's
        story is made of (envoy/story.py STORY_LOGGERS). `watch --envoy-debug` raises exactly these."""
        names = [n for d in self.detectors for n in d.envoy_loggers]
        if self._claims:
            names += STORY_LOGGERS
        return tuple(dict.fromkeys(names))

    @property
    def flows(self) -> FlowTable:
        return self.ctx.flows

    def feed(self, ev: PacketEvent) -> None:
        """One packet through the flow table and the detectors."""
        # Once a packet, ~30% of analyze's Python time: attribute lookups hoisted, the interface's stats and
        # readers found by one lookup, nothing done that is not needed.
        iface, ts = ev.iface, ev.ts
        per = self._reading.get(iface)
        if per is None:
            stats_of = self.stats.by_iface
            st = stats_of.get(iface)
            if st is None:
                st = stats_of[iface] = IfaceStats()
            per = self._reading[iface] = (st, self._packet_readers(iface))
        st, reading = per
        st.packets += 1
        if st.first_ts is None:
            st.first_ts = ts
        st.last_ts = ts
        stats = self.stats
        stats.packets += 1
        if self.recent.maxlen:
            self.recent.append(ev)
        flags = ev.flags._value_
        if iface == "lo" and flags & 0x12 == 0x02 and len(self._on_lo) < MAX_LO_ADDRESSES:
            self._on_lo.add(ev.src)
            self._on_lo.add(ev.dst)
        flows = self.ctx.flows
        flow = flows.observe(ev)
        stats.flows_seen = flows.counted
        kind = flags & 0x07  # FIN, SYN, RST: PACKET_KINDS' first three bits are the header's
        if ev.http is not None:
            kind |= 0x08
        if ev.tls is not None:
            kind |= 0x10
        for det in reading[kind]:
            found = det.on_packet(ev, flow)
            if found:  # most packets conclude nothing: () or [] skips the emit (a generator is always tried)
                self._emit(found)
        if self._next_tick is None or ts >= self._next_tick:
            self._next_tick = ts + TICK_EVERY_S
            self.tick(ts)

    def _packet_readers(self, iface: str) -> tuple[tuple[Detector, ...], ...]:
        """For each packet mask (detector.PACKET_KINDS' bits), the detectors, in order, whose ``on_packet`` reads
        packets of ``iface`` (Detector.packet_ifaces) and of one of that mask's kinds (Detector.packet_kinds; a
        packet of none, a pure ACK, goes to those that declare no kinds)."""
        readers = [(d, kinds_mask(d.packet_kinds)) for d in self.detectors
                   if type(d).on_packet is not Detector.on_packet
                   and (d.packet_ifaces is None or iface in d.packet_ifaces)]
        return tuple(tuple(d for d, mask in readers if mask == ALL_KINDS or mask & kind)
                     for kind in range(ALL_KINDS + 1))

    def context(self, ev: ContextEvent) -> None:
        """Something known about the pod: a redirect map replaces the default one; an access-log line is kept
        for correlation; moved counters back the findings ``finish`` returns. Every detector sees the event."""
        match ev:
            case RedirectMapEvent():
                self.ctx.redirect_map = ev.redirect_map
            case AccessLogEvent():
                self.correlator.pod = self.ctx.pod
                self.correlator.add(ev.entry, ev.source, ev.line)
            case EnvoyLogEvent():
                self.correlator.pod = self.ctx.pod
                builder = self._stories.get((ev.ref.source, ev.pod))
                if builder is None:
                    builder = self._stories[(ev.ref.source, ev.pod)] = StoryBuilder(ev.ref.source, ev.pod)
                for story in builder.add(ev.fact, ev.ref):
                    self.correlator.add_story(story)
            case EnvoyCountersEvent():
                self._envoy_moved = {k: dict(v) for k, v in ev.moved.items()}
                self._counters = ev
            case ClustersEvent():
                # Admin dumps alone are evidence too: a /clusters dump without /stats still gets its say.
                self._counters = self._counters or EnvoyCountersEvent(ev.ts, {}, since="Envoy's start",
                                                                      source=ev.source)
            case KernelCountersEvent():
                self._kernel_moved = dict(ev.moved)
            case PodEvent():
                self._pods = [*self._pods[:1], ev]
            case CaptureStartEvent():
                self.correlator.judged_from = max(self.correlator.judged_from or ev.ts, ev.ts)
                self.correlator.capture_pending = False
        if self.correlator.evicted:
            self._emit(self.correlator.decide_evicted(self._wire, self._claims))
        for det in self.detectors:
            self._emit(det.on_context(ev))

    def add_findings(self, findings: Iterable[Finding]) -> None:
        """Findings concluded outside the packet path (the pod spec's lint at the start of a watch)."""
        self._emit(findings)

    def tick(self, now: float) -> None:
        for det in self.detectors:
            self._emit(det.on_tick(now))
        for builder in self._stories.values():
            for story in builder.expire(now):
                self.correlator.add_story(story)
        self._emit(self.correlator.unexplained(now, self._wire, self._claims))

    def finish(self) -> list[Finding]:
        """End of input: let detectors conclude, link findings to the access-log lines they explain, report the
        failing lines nothing explains, attach the counters that back each finding (from the counters events
        seen); return every finding kept."""
        self.finished = True
        for det in self.detectors:
            self._emit(det.finish())
        for builder in self._stories.values():
            for story in builder.finish():
                self.correlator.add_story(story)
        own = own_addresses(self._on_lo)
        self.findings = [with_end(self._redacted(self.correlator.attach(f)), own) for f in self.findings]
        self._wire = [f for f in self.findings if of_the_wire(f)]
        self._emit(self.correlator.unexplained(None, self._wire, self._claims))
        # Both hops' logs read together (a caller's and a server's sidecar): one finding per failing request.
        self.findings = join_hops(self.findings)
        quoted = {line for f in self.findings for line in f.access_log}
        self.logged = tuple(LoggedLine(self.ctx.pod, text, entry, ev) for entry, text, ev in self.correlator.answers()
                            if text not in quoted)
        if self._counters is not None:
            # The admin dumps (/stats, /clusters) name a class on their own only where nothing else of the run
            # did; elsewhere they back the findings that did (attach_counters below).
            named = {f.detector for f in self.findings}
            covered = {(flag, cluster) for f in self.findings for flag in f.envoy_flags for cluster in
                       (*clusters_of(f), "istio_requests_total")}
            # and the flags of the lines a finding quotes, on their own cluster: a caller's 503 UC joined to the
            # tls-mismatch that explains it is that count too, whatever the finding's own flags
            covered |= {(flag, cluster) for f in self.findings for entry in logged_entries(f)
                        for flag in entry.flags for cluster in (entry.upstream_cluster, "istio_requests_total")}
            for det in self.detectors:
                if det.id not in named:
                    # A count another class's findings already explain (port exhaustion's connect failures are
                    # upstream_cx_connect_fail too) is theirs, not a second class's.
                    self._emit(f for f in det.from_counters(self._counters)
                               if not any((flag, f.flow.server) in covered for flag in f.envoy_flags))
        by_id = {d.id: d for d in self.detectors}

        def backed(f: Finding) -> bool:
            return f.detector not in by_id or by_id[f.detector].backed_by_counters(f)

        if self._envoy_moved or (self._counters is not None and self._counters.stats):
            self.findings = attach_counters(self.findings, self._envoy_moved,
                                            {d.id: d.envoy_counters for d in self.detectors}, backed,
                                            self._counters.stats if self._counters is not None else None)
        if self._kernel_moved:
            self.findings = attach_kernel_counters(self.findings, self._kernel_moved,
                                                   {d.id: d.kernel_counters for d in self.detectors}, backed)
        if len(self._pods) > 1:
            self.findings = attach_sidecar_runs(self.findings, self._pods[-1],
                                                {d.id for d in self.detectors if d.pod_runs})
        return self.findings

    def addresses(self) -> frozenset[str]:
        """The pod's own IPs as far as the run tells: those of its lo's SYNs (hop_path.own_addresses), its
        status.podIPs (PodEvent, a watch), and the %DOWNSTREAM_LOCAL_ADDRESS% of its sidecar's inbound lines (the
        pod's IP:port the caller dialled, which the sidecar reads after the REDIRECT as SO_ORIGINAL_DST). A run of
        several pods finds the upstream pod of a caller's line by them (core/upstream_pod.py)."""
        inbound = {ip_of(e.downstream_local) for e in self.correlator.entries() if direction(e) == "inbound"}
        ips = (*own_addresses(self._on_lo), *(ip for p in self._pods for ip in p.ips))
        return frozenset(a for a in (*(ip_of(f"[{ip}]:0") for ip in ips), *inbound) if a is not None)

    def so_far(self) -> tuple[list[Finding], tuple[LoggedLine, ...]]:
        """Mid-run, what ``finish`` would make of the findings kept so far: each with the access-log and debug-log
        lines it explains (Correlator.attach), the hops of one request joined (join_hops), and the 5xx lines no
        finding quotes (as ``logged``); after ``finish``, its own. No detector concludes anything for it. A finding
        is attached again only when a line read since the last call may be its (the line's request started no later
        than WINDOW_S after the finding's evidence), so a call costs the new lines and the recent findings, not
        every finding against every line; join_hops costs up to findings squared, so call it on a tick, not a
        packet (core/live_join.py)."""
        if self.finished:
            return list(self.findings), self.logged
        corr = self.correlator
        earliest = corr.earliest_since(self._attached_kept)
        self._attached_kept = corr.kept
        if earliest is not None:
            for i, f in enumerate(self.findings[:len(self._attached)]):
                if of_the_wire(f) and max([e.ts for e in f.evidence if e.ts] or [f.ts]) + WINDOW_S >= earliest:
                    self._attached[i] = self._redacted(corr.attach(f))
        self._attached += [self._redacted(corr.attach(f)) for f in self.findings[len(self._attached):]]
        own = own_addresses(self._on_lo)
        joined = join_hops([with_end(f, own) for f in self._attached])
        quoted = {line for f in joined for line in f.access_log}
        return joined, tuple(LoggedLine(self.ctx.pod, text, entry, ev) for entry, text, ev in corr.answers()
                             if text not in quoted)

    def _redacted(self, f: Finding) -> Finding:
        return redact_finding(f) if self.ctx.redact else f

    def _emit(self, found: Iterable[Finding]) -> None:
        # Request targets are scrubbed here, where every finding passes, rather than in each detector that
        # quotes a path or an access-log line; header values are the detectors' business (they know the fields).
        for f in map(self._redacted, found):
            if len(self.findings) < MAX_FINDINGS:
                if f.severity is Severity.INFO:
                    self._info_slots.append(len(self.findings))
                self.findings.append(f)
                if of_the_wire(f):
                    self._wire.append(f)
            else:
                self.stats.findings_dropped += 1
                if f.severity is not Severity.INFO and self._info_slots:
                    # Full: a failure takes the slot of the oldest info finding (an app's own 5xx, told), which
                    # is the one counted as dropped; a failure is never the one lost for an info.
                    i = self._info_slots.popleft()
                    if of_the_wire(self.findings[i]):
                        self._wire = [w for w in self._wire if w is not self.findings[i]]
                    self.findings[i] = f
                    if i < len(self._attached):
                        self._attached[i] = f  # attached again at finish (so_far: when a line may be its)
                    if of_the_wire(f):
                        self._wire.append(f)
            self.emitted += 1
            if self._on_finding is not None:
                self._on_finding(f)


def _claim(det: Detector) -> Claim:
    """The correlator's way into one detector: a request the debug log tells of through from_envoy_log (with the
    access-log line of the same request, when there is one), a line alone through from_access_log."""

    def claim(entry: AccessLogEntry, story: StreamStory | None, evidence: Evidence) -> Finding | None:
        if story is not None:
            return det.from_envoy_log(story, evidence, entry if entry.raw else None)
        return det.from_access_log(entry, evidence)

    return claim


def merged_stats(pipelines: list[Pipeline]) -> PipelineStats:
    """Counts of every pod's pipeline; interfaces as ``pod/iface`` when there is more than one pod."""
    if len(pipelines) == 1:
        return pipelines[0].stats
    out = PipelineStats(missed=pipelines[0].stats.missed)  # one run: every pod's pipeline has the same detectors
    for p in pipelines:
        out.packets += p.stats.packets
        out.flows_seen += p.stats.flows_seen
        for iface, st in p.stats.by_iface.items():
            out.by_iface[f"{p.ctx.pod}/{iface}"] = st
    return out
