"""Normalized events that flow from sources to detectors.

Sources (pcap files, live exec streams, Envoy admin and access log, kernel counters, the pod spec) turn what
they read into these frozen dataclasses: ``PacketEvent`` for packets, one ``ContextEvent`` kind for the rest.
Detectors consume nothing else, so they never depend on pyshark, tshark or the Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
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

    # One a message start read: stored through the slots, as PacketEvent's (0.58 us -> 0.39 us).
    def __init__(self, start_line, headers=(), raw_header_lines=(), complete=True, raw_owners=()) -> None:
        _set_start_line(self, start_line)
        _set_headers(self, headers)
        _set_raw_header_lines(self, raw_header_lines)
        _set_complete(self, complete)
        _set_raw_owners(self, raw_owners)

    @property
    def is_request(self) -> bool:
        return not self.start_line.startswith("HTTP/")

    @property
    def status(self) -> int | None:
        """A response's status code (RFC 9112 section 4: three ASCII digits), None for a request or a status
        line that has none."""
        line = self.start_line
        if not line.startswith("HTTP/"):
            return None
        parts = line.split(" ", 2)
        code = parts[1] if len(parts) > 1 else ""
        return int(code) if len(code) == 3 and code.isascii() and code.isdigit() else None


_set_start_line, _set_headers, _set_raw_header_lines, _set_complete, _set_raw_owners = (
    HttpStart.__dict__[f.name].__set__ for f in fields(HttpStart))


# TLS record content types (RFC 8446 section 5.1) and handshake types (section 4) the capture reads.
ALERT, HANDSHAKE, APPLICATION_DATA = 21, 22, 23
CLIENT_HELLO, SERVER_HELLO = 1, 2
CLOSE_NOTIFY = 0  # AlertDescription (RFC 8446 section 6)
# TLS 1.3 encrypts alerts: a 2-byte alert, its 1-byte inner content type and a 16-byte AEAD tag (every TLS 1.3
# suite but TLS_AES_128_CCM_8_SHA256, which BoringSSL, Envoy's TLS, does not offer) in an application-data
# record of 19 bytes (RFC 8446 sections 5.2 and 6).
ENCRYPTED_ALERT_LENGTH = 19
_TLS_VERSIONS = {0x0301: "TLS 1.0", 0x0302: "TLS 1.1", 0x0303: "TLS 1.2", 0x0304: "TLS 1.3"}


@dataclass(frozen=True, slots=True)
class TlsStart:
    """The TLS record a TCP segment's payload starts with (sources/tls_records.py), one of those a capture
    reads without keys: a handshake record (``handshake_type`` 1 ClientHello with its ``sni`` and ``alpn``, 2
    ServerHello with its ``selected_version`` from supported_versions, and ALPN in TLS 1.2), a plaintext alert
    (``alert``: level, description), or application data of TLS 1.3's encrypted alert length.

    ``content_type`` (RFC 8446 section 5.1: 21 alert, 22 handshake, 23 application data), ``version`` (the
    record's legacy_record_version, 0x0301..0x0303), ``length`` (the record's, bytes); ``complete`` is False
    when the hello did not end inside the segment, or did not parse (its SNI and ALPN are then unknown)."""

    content_type: int
    version: int
    length: int
    handshake_type: int | None = None
    sni: str | None = None
    alpn: tuple[str, ...] = ()
    selected_version: int | None = None
    alert: tuple[int, int] | None = None
    complete: bool = True

    @property
    def is_client_hello(self) -> bool:
        return self.content_type == HANDSHAKE and self.handshake_type == CLIENT_HELLO

    @property
    def is_server_hello(self) -> bool:
        return self.content_type == HANDSHAKE and self.handshake_type == SERVER_HELLO

    @property
    def is_encrypted_alert(self) -> bool:
        """An application-data record of TLS 1.3's encrypted-alert size (RFC 8446 sections 5.2 and 6): the record
        a peer sends when it closes (close_notify), or a fatal alert; its description is encrypted."""
        return self.content_type == APPLICATION_DATA and self.length == ENCRYPTED_ALERT_LENGTH

    @property
    def is_alert(self) -> bool:
        """A plaintext alert record (TLS 1.2 and earlier, or one sent before TLS 1.3's keys: a handshake failure)."""
        return self.content_type == ALERT

    def short(self) -> str:
        """The record's name in a word or two, for the ladder's arrows: ``ClientHello``, ``ServerHello``, ``alert
        close_notify``, ``encrypted alert``, ``handshake``."""
        if self.is_client_hello:
            return "ClientHello"
        if self.is_server_hello:
            return "ServerHello"
        if self.is_alert:
            return "alert" if self.alert is None else \
                ("alert close_notify" if self.alert[1] == CLOSE_NOTIFY else f"alert {self.alert[1]}")
        if self.is_encrypted_alert:
            return "encrypted alert"
        return "handshake" if self.content_type == HANDSHAKE else f"TLS record {self.content_type}"

    def describe(self) -> str:
        """A few words for evidence and the ladder: ``ClientHello SNI ... ALPN a,b``, ``ServerHello TLS 1.3``,
        ``alert 2/40``, ``encrypted alert (19 B: close_notify at a close)``."""
        if self.is_client_hello:
            words = ["ClientHello"]
            if self.sni:
                words += ["SNI", self.sni]
            if self.alpn:
                words += ["ALPN", ",".join(self.alpn)]
            return " ".join(words)
        if self.is_server_hello:
            version = _TLS_VERSIONS.get(self.selected_version or self.version, "")
            return " ".join(w for w in ("ServerHello", version, "ALPN " + ",".join(self.alpn) if self.alpn else "")
                            if w)
        if self.is_alert:
            if self.alert is None:
                return "TLS alert (encrypted)"
            level, description = self.alert
            name = "close_notify" if description == CLOSE_NOTIFY else f"description {description}"
            return f"TLS alert {name} ({'fatal' if level == 2 else 'warning'})"
        if self.is_encrypted_alert:
            return "encrypted TLS alert (19-byte record)"
        if self.content_type == HANDSHAKE:
            return f"TLS handshake record (type {self.handshake_type})" if self.handshake_type is not None \
                else "TLS handshake record"
        return f"TLS record {self.content_type}"


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
    tls: TlsStart | None = None  # a TLS record the payload starts with, when it is one read (TlsStart)

    # The analyze process builds one of these for every packet it reads: a frozen dataclass's own __init__ stores
    # each field with object.__setattr__ by name (1.5 us for these fourteen), this one through each slot's
    # descriptor (1.0 us). The same fields in the same order, with the same defaults (tests/core/test_events.py).
    def __init__(self, ts, iface, source, frame, src, sport, dst, dport, flags, seq, ack, payload_len=0, http=None,
                 tls=None) -> None:
        _set_ts(self, ts)
        _set_iface(self, iface)
        _set_source(self, source)
        _set_frame(self, frame)
        _set_src(self, src)
        _set_sport(self, sport)
        _set_dst(self, dst)
        _set_dport(self, dport)
        _set_flags(self, flags)
        _set_seq(self, seq)
        _set_ack(self, ack)
        _set_payload_len(self, payload_len)
        _set_http(self, http)
        _set_tls(self, tls)

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


(_set_ts, _set_iface, _set_source, _set_frame, _set_src, _set_sport, _set_dst, _set_dport, _set_flags, _set_seq,
 _set_ack, _set_payload_len, _set_http, _set_tls) = (PacketEvent.__dict__[f.name].__set__ for f in fields(PacketEvent))


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
    # Where ISTIO_REDIRECT sends the app's outbound connections (istio-iptables -p, 15001 by default): on lo
    # their SYNs show 127.0.0.1:15001 as the destination.
    outbound_port: int = 15001

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
class ContainerEvent:
    """One of the kubelet's events about a container of the pod (a core/v1 Event whose involvedObject.fieldPath
    names it): ``ts`` its lastTimestamp (seconds since the epoch), ``reason`` the kubelet's (Created, Started,
    Killing, BackOff, Unhealthy, ...; pkg/kubelet/events/event.go), ``count`` how many times it was seen."""

    ts: float
    container: str
    reason: str
    message: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class ContainerExit:
    """How a container's latest run ended (its status's ``state.terminated`` while it is ``down``, else its
    ``lastState.terminated``): ``finished`` (seconds since
    the epoch, None when not given), the ``exit_code`` (128 + N: killed by signal N, so 137 is SIGKILL: an OOM
    kill or a crash the kernel ended) and the kubelet's ``reason`` (Completed, Error, OOMKilled)."""

    finished: float | None
    exit_code: int
    reason: str
    down: bool = False  # the container's current state (state.terminated: not restarted yet), not its lastState


@dataclass(frozen=True, slots=True)
class PodEvent:
    """What the pod's status says when a watch starts: ``restarts`` of its app containers (the sidecar's aside),
    as `kubectl get pod` counts them; ``sidecar_restarts`` the istio-proxy container's. ``sidecar_started`` and
    ``app_started``: when istio-proxy's current run and the first app container's began (their
    ``state.running.startedAt``, seconds since the epoch; None when not running or not read). ``hold``: how the
    spec makes the app wait for the proxy (lint's hold-application: "native sidecar", "postStart pilot-agent
    wait", "" for not at all; None when the spec was not read). ``sidecar_last_exit``: how istio-proxy's previous
    run ended; ``history``: the kubelet's events about the containers, where they could be read."""

    ts: float
    name: str
    restarts: int
    sidecar_restarts: int = 0
    sidecar_started: float | None = None
    app_started: float | None = None
    hold: str | None = None
    sidecar_last_exit: ContainerExit | None = None
    # the kubelet's events about the pod's containers, oldest first (empty when not read: kube/pod_events.py)
    history: tuple[ContainerEvent, ...] = ()
    ips: tuple[str, ...] = ()  # status.podIPs: what tells a finding about this pod's sidecar from one about a peer's


@dataclass(frozen=True, slots=True)
class CaptureStartEvent:
    """A live run's capture began at ``ts`` (seconds since the epoch) on every pod it watches: a request Envoy
    logged that started earlier had no packet to be seen, so its line is context, not a failure to judge."""

    ts: float


# Something known about the pod that is not a packet. One dataclass per kind, so a consumer matches on the type.
ContextEvent = (RedirectMapEvent | AccessLogEvent | EnvoyLogEvent | EnvoyCountersEvent | ClustersEvent
                | KernelCountersEvent | ListenersEvent | PodEvent | CaptureStartEvent)
