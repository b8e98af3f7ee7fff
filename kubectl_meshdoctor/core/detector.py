"""The detector API: what a detector is given (``DetectorContext``), what it overrides (``Detector``) and
the bounded helpers several share. ``registry`` finds detectors; this module knows none of them.

A detector is one module (the built-ins in the top-level ``plugins/``, installed as
``kubectl_meshdoctor_plugins``) registered under the entry-point group ``kubectl_meshdoctor.detectors``. It
consumes events, keeps its own bounded state and returns findings. It imports neither a source nor a sink, the
Kubernetes client nor pyshark (docs/ADDING_A_DETECTOR.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.story import StreamStory

from .events import ContextEvent, EnvoyCountersEvent, PacketEvent, RedirectMap
from .findings import Evidence, Finding
from .flows import Flow, FlowTable
from .unseen import IfaceStats


# Detector.packet_kinds' names -> their bit in the pipeline's mask of a packet: the TCP header's own FIN, SYN and
# RST bits (RFC 9293 section 3.1), then an HTTP/1 start and a TLS record.
PACKET_KINDS = {"fin": 0x01, "syn": 0x02, "rst": 0x04, "http": 0x08, "tls": 0x10}
ALL_KINDS = 0x1F


def kinds_mask(kinds: frozenset[str] | None) -> int:
    """The mask of ``kinds`` (Detector.packet_kinds), ALL_KINDS for None. Raises ValueError for a kind not in
    PACKET_KINDS: a misspelt declaration would silently starve its detector."""
    if kinds is None:
        return ALL_KINDS
    unknown = set(kinds) - set(PACKET_KINDS)
    if unknown:
        raise ValueError(f"unknown packet kind(s) {sorted(unknown)}; known: {sorted(PACKET_KINDS)}")
    mask = 0
    for kind in kinds:
        mask |= PACKET_KINDS[kind]
    return mask


@dataclass(slots=True)
class DetectorContext:
    """What every detector may read: the shared flow table and what is known about the pod."""

    flows: FlowTable
    redirect_map: RedirectMap = field(default_factory=RedirectMap)
    pod: str | None = None
    redact: bool = True  # hide secret header values in evidence (docs/DESIGN.md, privacy); --no-redact turns it off
    # The packets read so far of each interface (lo, eth0: their count, first and latest time), the pipeline's own
    # PipelineStats.by_iface: which captures a run holds over a time (core/unseen.captured), for advice to capture
    # only what is missing.
    by_iface: dict[str, IfaceStats] = field(default_factory=dict)


class Detector:
    """Base class. Subclasses set ``id`` (stable, part of the report contract) and override the hooks they need.

    Hooks return an iterable of findings (empty when nothing is concluded). ``on_packet`` is called after the
    flow table has seen the packet; ``flow`` is that packet's flow. ``on_tick`` gets the newest packet time
    (seconds) so detectors can conclude on silence (an unanswered SYN); ``finish`` is called once at the end.
    """

    id: ClassVar[str] = ""
    # The cluster stats (names after `cluster.<name>.`) that real Envoy moves on the inbound cluster of the
    # finding's server port, or on the cluster its access-log line names (a caller's outbound cluster), when this
    # failure happens; ``http.STAT`` and ``listener.STAT`` for the HCM's (of the server port) and the listeners'
    # stats. The report attaches those that moved during the run.
    envoy_counters: ClassVar[tuple[str, ...]] = ()
    # The kernel counters (nstat names, read from the pod's network namespace) that count this failure; the
    # report attaches those that moved during the run.
    kernel_counters: ClassVar[tuple[str, ...]] = ()
    # The Envoy loggers whose debug lines this detector reads (from_envoy_log's stories are made of them):
    # `watch --envoy-debug` raises exactly the union of these, for the run only.
    envoy_loggers: ClassVar[tuple[str, ...]] = ()
    # Whether its findings quote the sidecar's runs (core/pod_history.py): the pod read again when the run ends
    # (its status, the kubelet's events) adds the runs that ended or began since, a termination watched.
    pod_runs: ClassVar[bool] = False
    # The interfaces whose packets ``on_packet`` reads (PacketEvent.iface: "lo", "eth0"); None, every one. The
    # pipeline hands a packet only to the detectors that read its interface and override ``on_packet``: calling
    # each detector for each packet to return at once was most of the detectors' share of analyze's CPU.
    packet_ifaces: ClassVar[frozenset[str] | None] = None
    # The packets ``on_packet`` reads, by what they carry (PACKET_KINDS): "syn", "fin", "rst" (that TCP flag set; a
    # SYN-ACK is a "syn"), "http" (an HTTP/1 start), "tls" (a TLS record read); None, every packet. The pipeline
    # hands a detector only packets of one of its kinds, so a declaration must hold for every other packet:
    # on_packet would return nothing and change nothing (tests/core/test_pipeline_dispatch.py runs every recording
    # with and without the declarations). On bench/gen's short-connection mix, most of the packets an HTTP-only
    # detector was called for carried no HTTP start.
    packet_kinds: ClassVar[frozenset[str] | None] = None
    # The interface ("lo" or "eth0") whose packets alone carry a failure class of this detector -> what a reader of
    # a run without that interface's packets would miss, in a few words ("the collision's challenge ACK"). The
    # report's "not seen" line lists these (core/unseen.py); each interface is one ``on_packet`` reads.
    unseen_without: ClassVar[Mapping[str, str]] = {}
    # Where those phrases stand among the others of their interface in the "not seen" line and json not_seen
    # (scripts may read it by position): lower first, equal ranks in the detectors' load order
    # (core/unseen.missed_by). An editorial order, the class a reader most often needs the interface for first,
    # which the load order (the entry points') does not say. The default lists a detector that gives no rank
    # after the built-ins, which all rank below it.
    unseen_rank: ClassVar[int] = 100

    def __init__(self, ctx: DetectorContext) -> None:
        self.ctx = ctx

    def backed_by_counters(self, f: Finding) -> bool:
        """Whether the run's ``envoy_counters`` and ``kernel_counters`` that moved back ``f``. False for a finding
        that says no failure happened (an exposure): the counters of a failure would make it read like one."""
        return True

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        return ()

    def on_context(self, ev: ContextEvent) -> Iterable[Finding]:
        return ()

    def on_tick(self, now: float) -> Iterable[Finding]:
        return ()

    def finish(self) -> Iterable[Finding]:
        return ()

    def from_access_log(self, entry: AccessLogEntry, evidence: Evidence) -> Finding | None:
        """This detector's finding of an access-log line that no packet finding explains (checked GRACE_S
        after the line, in core/correlate.py), or None when the line is not its class. ``evidence`` names the
        line. Lets a class Envoy logs clearly be found from the log alone."""
        return None

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        """This detector's findings of what Envoy's counters alone show (a `/stats` dump, or what moved during a
        watch): called once at the end of the run, only when no packet or log line gave a finding of this
        detector (those are backed by the counters instead). core/counters.py builds such findings."""
        return ()

    def from_envoy_log(self, story: StreamStory, evidence: Evidence,
                       entry: AccessLogEntry | None) -> Finding | None:
        """This detector's finding of a request Envoy's own (debug) log tells of (``story``, envoy/story.py) that
        no packet finding explains, or None when it is not its class. ``entry`` is the access-log line of the
        same request when one was read (joined by x-request-id, else by time and details); ``evidence`` names
        the first of their lines. By default the story is read as the access-log line Envoy would have written
        for it (``from_access_log``), so a class named from the access log is named from the debug log too."""
        return self.from_access_log(entry if entry is not None else story.entry(), evidence)


class PendingSyns:
    """Connection attempts a detector waits on, keyed by (iface, client, server), bounded in count and age.

    ``max_items``: the oldest attempt goes first when full; ``ttl_s``: ``expire(now)`` drops attempts whose SYN
    is older than this (packet time, seconds). Values must have a ``syn`` PacketEvent attribute.
    """

    def __init__(self, max_items: int = 10_000, ttl_s: float = 60.0) -> None:
        self.max_items = max_items
        self.ttl_s = ttl_s
        self._items: dict = {}
        self._clients: dict = {}  # (iface, client endpoint) -> key, for answers whose source NAT rewrote

    @staticmethod
    def key_of_syn(ev: PacketEvent) -> tuple:
        return (ev.iface, (ev.src, ev.sport), (ev.dst, ev.dport))

    @staticmethod
    def key_of_answer(ev: PacketEvent) -> tuple:
        """The attempt a packet from the server answers: it travels server -> client."""
        return (ev.iface, (ev.dst, ev.dport), (ev.src, ev.sport))

    def get(self, key):
        return self._items.get(key)

    def of_client(self, ev: PacketEvent):
        """The attempt of the client endpoint ``ev`` is sent to on its interface, whoever sends it: on ``lo`` an
        outbound SYN shows its REDIRECTed destination (127.0.0.1:15001) and its answer the original one, as
        conntrack restores the source before the answer is looped back. None when there is none."""
        key = self._clients.get((ev.iface, (ev.dst, ev.dport)))
        return self._items.get(key) if key is not None else None

    def add(self, key, value) -> None:
        if len(self._items) >= self.max_items and key not in self._items:
            self.pop(next(iter(self._items)))
        self._items[key] = value
        self._clients[(key[0], key[1])] = key

    def pop(self, key) -> None:
        if self._items.pop(key, None) is not None and self._clients.get((key[0], key[1])) == key:
            del self._clients[(key[0], key[1])]

    def values(self) -> list:
        return list(self._items.values())

    def expire(self, now: float) -> None:
        for k in [k for k, v in self._items.items() if now - v.syn.ts > self.ttl_s]:
            self.pop(k)
