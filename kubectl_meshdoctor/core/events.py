"""Normalized events that flow from sources to detectors.

Sources (pcap files, live exec streams, Envoy admin and access log, kernel counters, the pod spec) turn what
they read into these frozen dataclasses: ``PacketEvent`` for packets, one ``ContextEvent`` kind for the rest.
Detectors consume nothing else, so they never depend on pyshark, tshark or the Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntFlag

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry
from kubectl_meshdoctor.envoy.component_facts import Fact
from kubectl_meshdoctor.envoy.story import LogRef


class TcpFlags(IntFlag):
    """TCP header flag bits, as on the wire (RFC 9293 section 3.1)."""

    FIN = 0x01
    SYN = 0x02
    RST = 0x04
    PSH = 0x08
    ACK = 0x10
    URG = 0x20

    def short(self) -> str:
        """tcpdump-style flag string: ``S``, ``S.``, ``R.``, ``P.``, ``F.`` (``.`` is ACK)."""
        out = ""
        for bit, ch in ((TcpFlags.SYN, "S"), (TcpFlags.FIN, "F"), (TcpFlags.RST, "R"), (TcpFlags.PSH, "P")):
            if self & bit:
                out += ch
        if self & TcpFlags.ACK:
            out += "."
        return out or "none"


@dataclass(frozen=True, slots=True)
class HttpStart:
    """The start of an HTTP/1 message as it was on the wire.

    ``start_line`` is the request or status line; ``headers`` are (name, value) pairs in wire order with their
    original case and duplicates kept, because framing rules (RFC 9112 section 6) depend on exactly that.
    ``raw_header_lines`` keeps lines that did not parse as ``name: value`` (bad header bytes, obs-fold
    continuations); ``raw_owners`` says, for each, the name of the field line above it, which a continuation
    belongs to (RFC 9112 section 5.2): redaction must hide a folded ``Cookie`` as it hides the ``Cookie`` line.
    """

    start_line: str
    headers: tuple[tuple[str, str], ...] = ()
    raw_header_lines: tuple[str, ...] = ()
    complete: bool = True  # False when the header block did not end inside this segment
    raw_owners: tuple[str, ...] = ()  # "" where no field line came before

    @property
    def is_request(self) -> bool:
        return not self.start_line.startswith("HTTP/")

    @property
    def status(self) -> int | None:
        """A response's status code (RFC 9112 section 4: three ASCII digits), None for a request or a status
        line that has none."""
        parts = self.start_line.split(" ", 2)
        code = parts[1] if len(parts) > 1 and not self.is_request else ""
        return int(code) if len(code) == 3 and code.isascii() and code.isdigit() else None


@dataclass(frozen=True, slots=True)
class PacketEvent:
    """One TCP segment seen on one interface.

    ``ts`` is seconds since the epoch; ``frame`` is the 1-based frame number within ``source`` exactly as
    Wireshark numbers it in the user's file (display filters keep that numbering); ``seq``/``ack`` are raw
    (absolute) sequence numbers; ``payload_len`` is in bytes.
    """

    ts: float
    iface: str
    source: str
    frame: int
    src: str
    sport: int
    dst: str
    dport: int
    flags: TcpFlags
    seq: int
    ack: int
    payload_len: int = 0
    http: HttpStart | None = None

    # These run several times per packet: plain int arithmetic on the flag's value, because each IntFlag
    # operator builds a new enum member (measured: a fifth of the pipeline's time).
    @property
    def is_syn(self) -> bool:
        """A connection request: SYN without ACK."""
        return self.flags._value_ & 0x12 == 0x02

    @property
    def is_syn_ack(self) -> bool:
        return self.flags._value_ & 0x12 == 0x12

    @property
    def is_rst(self) -> bool:
        return bool(self.flags._value_ & 0x04)

    @property
    def is_fin(self) -> bool:
        return bool(self.flags._value_ & 0x01)

    @property
    def src_endpoint(self) -> str:
        return endpoint(self.src, self.sport)

    @property
    def dst_endpoint(self) -> str:
        return endpoint(self.dst, self.dport)


def endpoint(ip: str, port: int) -> str:
    """``ip:port``, with IPv6 addresses in brackets as URLs and Envoy write them (``[::1]:5000``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def split_endpoint(text: str) -> tuple[str, str]:
    """``endpoint``'s inverse: (ip without brackets, port as written)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), port


@dataclass(frozen=True, slots=True)
class RedirectMap:
    """Which inbound pod ports Istio's nat rules REDIRECT to which listener port.

    Built from the pod spec and its ``traffic.sidecar.istio.io/*`` annotations (see
    ``istio/redirect.py``); detectors use it to know that two pod ports share one listener socket space.
    ``include_all`` mirrors istio-iptables ``-b '*'``; ``excluded`` are the RETURNed ports; ``included`` is used
    when ``include_all`` is False.
    """

    listener_port: int = 15006
    include_all: bool = True
    included: frozenset[int] = frozenset()
    excluded: frozenset[int] = frozenset({15008, 15090, 15021, 15020})

    def listener_for(self, port: int) -> int | None:
        """The listener port a connection to ``port`` is REDIRECTed to, or None when it is not captured."""
        if port in self.excluded:
            return None
        if self.include_all or port in self.included:
            return self.listener_port
        return None


@dataclass(frozen=True, slots=True)
class RedirectMapEvent:
    """The pod's redirect map, derived from its spec (istio/redirect.py); it replaces the default one."""

    ts: float  # seconds since the epoch
    redirect_map: RedirectMap


@dataclass(frozen=True, slots=True)
class AccessLogEvent:
    """One line of the sidecar's access log, parsed (envoy/access_log.py): kept for correlation with findings."""

    ts: float  # seconds since the epoch: when the line was read live, when its request ended offline
    entry: AccessLogEntry
    source: str | None = None  # where it was read: a file offline; None for the followed istio-proxy log
    line: int = 0  # its line number there (1-based); 0: count the lines as they come


@dataclass(frozen=True, slots=True)
class EnvoyLogEvent:
    """One fact of Envoy's own (component, debug) log (envoy/component_facts.py) and the line it came from.
    ``ts``: the line's time (seconds since the epoch), else when it was read. ``ref.source`` names the Envoy: one
    file offline, one pod's istio-proxy log live; connection ids are that Envoy's own."""

    ts: float
    fact: Fact
    ref: LogRef
    pod: str | None = None  # the pod a wrapper named (kubectl logs --prefix): several Envoys in one file


@dataclass(frozen=True, slots=True)
class EnvoyCountersEvent:
    """The sidecar's stats that moved: ``moved`` its cluster stats (cluster -> stat after ``cluster.<name>.`` ->
    delta), which back the findings of the detectors that declare them (Detector.envoy_counters); ``stats``
    every integer stat that moved, by its full name (cluster, HCM ``http.``, ``listener.`` and the rest), which
    detectors read on their own (Detector.from_counters). ``since`` says from when: "the run" (watch: before
    and after), "the first dump" (two dumps), "Envoy's start" (one dump: totals, ``uptime_s`` seconds after
    Envoy started, from its ``server.uptime``). ``source``: where they were read (the dump files, the pod)."""

    ts: float
    moved: Mapping[str, Mapping[str, int]]
    stats: Mapping[str, int] = field(default_factory=dict)
    since: str = "the run"
    uptime_s: float | None = None
    source: str = ""


@dataclass(frozen=True, slots=True)
class ClustersEvent:
    """The sidecar's clusters as its admin `/clusters` shows them: ``hosts`` cluster -> how many endpoints,
    ``unhealthy`` cluster -> endpoint (``ip:port``) -> the health flags that keep Envoy from routing to it
    (``failed_outlier_check``: ejected by outlier detection; ``failed_active_hc``: a failed health check).
    ``source``: where it was read."""

    ts: float
    hosts: Mapping[str, int]
    unhealthy: Mapping[str, Mapping[str, tuple[str, ...]]]
    source: str = ""


@dataclass(frozen=True, slots=True)
class KernelCountersEvent:
    """The pod network namespace's kernel counters that moved during the run: nstat name -> delta. A finding is
    backed by those its detector declares (Detector.kernel_counters)."""

    ts: float
    moved: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ListenersEvent:
    """The TCP sockets that listen in the pod's network namespace, as (address, port); ``0.0.0.0`` and ``::``
    listen on every address. Read from the kernel when a watch starts."""

    ts: float
    listening: frozenset[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class PodEvent:
    """What the pod's status says when a watch starts: ``restarts`` of its app containers (the sidecar's aside),
    as `kubectl get pod` counts them."""

    ts: float
    name: str
    restarts: int


# Something known about the pod that is not a packet. One dataclass per kind, so a consumer matches on the type.
ContextEvent = (RedirectMapEvent | AccessLogEvent | EnvoyLogEvent | EnvoyCountersEvent | ClustersEvent
                | KernelCountersEvent | ListenersEvent | PodEvent)
