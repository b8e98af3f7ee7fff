"""Findings: what a detector concluded, with the evidence that proves it and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import Enum

from .events import PacketEvent, endpoint
from .fixes import Fix, render


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


# What a piece of evidence is (Evidence.kind), and the kinds a finding may stand on (Finding.stands_on).
PACKET, ACCESS_LOG, ENVOY_LOG, COUNTER, SPEC = "packet", "access-log", "envoy-log", "counter", "spec"
LOG_KINDS = (ACCESS_LOG, ENVOY_LOG)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One packet, log line, counter or spec field that a finding rests on; ``kind`` says which (PACKET,
    ACCESS_LOG, ENVOY_LOG, COUNTER, SPEC). ``frame`` is the packet's frame number in ``source``, or the log
    line's 1-based line number there (``line``); None for a counter or a spec field, which have no place in a
    stream (the JSON report writes 0 there, as it always has: docs/DESIGN.md). ``name`` is what a counter or a
    spec field is called (``cluster.inbound|5000||.upstream_cx_connect_fail``, ``spec.containers[0].ports[0]``);
    ``what`` says all of it in one line (``name: value`` or ``name = value`` for those two kinds).

    For a packet, ``src``/``dst`` are its ``ip:port`` endpoints and ``flags`` its tcpdump-style flags (``S``,
    ``R.``); they are empty for the other kinds, which the ladder diagram shows as notes."""

    source: str
    iface: str
    frame: int | None
    ts: float
    what: str
    src: str = ""
    dst: str = ""
    flags: str = ""
    payload_len: int = 0  # bytes
    kind: str = PACKET
    name: str = ""
    record: str = ""  # a packet's TLS record by name (``ClientHello``, ``close_notify``), which the ladder shows

    def __post_init__(self) -> None:
        # A detector written against the older shape passes frame 0 for a counter or a spec field: no frame.
        if self.kind in (COUNTER, SPEC) and not self.frame:
            object.__setattr__(self, "frame", None)

    @classmethod
    def of(cls, ev: PacketEvent, what: str, record: str | None = None) -> "Evidence":
        """Evidence pointing at the packet ``ev``; ``record`` names its TLS record where the detector knows more
        than the record's shape says (an encrypted alert at a close is close_notify), else its TlsStart's name."""
        if record is None:
            record = ev.tls.short() if ev.tls is not None else ""
        return cls(ev.source, ev.iface, ev.frame, ev.ts, what, ev.src_endpoint, ev.dst_endpoint, ev.flags.short(),
                   ev.payload_len, record=record)

    @classmethod
    def log_line(cls, source: str, line: int, ts: float, what: str, kind: str = ACCESS_LOG) -> "Evidence":
        """Line ``line`` (1-based) of the log ``source`` (a file, or ``pod/NAME istio-proxy``): an access-log
        line (ACCESS_LOG) or one of Envoy's own (ENVOY_LOG). ValueError for another kind."""
        if kind not in LOG_KINDS:
            raise ValueError(f"a log line is {' or '.join(LOG_KINDS)}, not {kind}")
        return cls(source, "", line, ts, what, kind=kind)

    @classmethod
    def counter(cls, source: str, ts: float, name: str, value: str) -> "Evidence":
        """Envoy's counter (or a /clusters entry) ``name`` as ``source`` (a dump, the admin port) gave it at
        ``ts``: ``value`` says how much and over what time (``3 since Envoy's start``)."""
        return cls(source, "", None, ts, f"{name}: {value}", kind=COUNTER, name=name)

    @classmethod
    def spec_field(cls, source: str, field_path: str, value: str) -> "Evidence":
        """The field ``field_path`` of the pod ``source`` (``pod/NAME``) and its ``value`` as the spec holds it."""
        return cls(source, "", None, 0.0, f"{field_path} = {value}", kind=SPEC, name=field_path)

    @property
    def line(self) -> int | None:
        """The log line's number, for a log line; None for the other kinds."""
        return self.frame if self.kind in LOG_KINDS else None

    def locator(self) -> str:
        """Where in ``source`` it is, by its kind: ``frame 10`` (a packet), ``line 396`` (a log line: no
        interface), ``counter``, ``spec field``; empty for a packet of no known frame."""
        if self.kind == COUNTER:
            return "counter"
        if self.kind == SPEC:
            return "spec field"
        if self.kind in LOG_KINDS or (not self.iface and self.frame):
            return f"line {self.frame}"
        return f"frame {self.frame}" if self.frame else ""

    def cited(self) -> str:
        """One line naming it by its kind: ``eth0.pcap frame 10: SYN``, ``istio-proxy.log line 396: ...``,
        ``stats.txt counter cluster.x.upstream_cx_connect_fail: 3 ...`` (a counter by its name), ``pod/web spec
        field spec.containers[0].ports[0].containerPort = 5000`` (a spec field by its field). A counter or a
        spec field has no frame to name."""
        where = self.locator()
        if self.name and self.what.startswith(self.name):  # its name leads ``what``: not said twice
            return f"{self.source} {where} {self.what}"
        return f"{self.source} {where}: {self.what}" if where else f"{self.source}: {self.what}"

    def to_dict(self) -> dict:
        """The report's ``evidence[]`` entry (docs/DESIGN.md): ``frame`` 0 where there is none; ``name`` is
        in ``what`` already."""
        return {"source": self.source, "iface": self.iface, "frame": self.frame or 0, "ts": self.ts,
                "what": self.what, "src": self.src, "dst": self.dst, "flags": self.flags,
                "payload_len": self.payload_len, "kind": self.kind, **({"record": self.record} if self.record else {})}


@dataclass(frozen=True, slots=True)
class FlowRef:
    """The connection a finding is about: client and server as ``ip:port``, and the interface it was seen on
    (empty for one Envoy's logs told of; its client is ``-`` when the line named no caller)."""

    client: str
    server: str
    iface: str

    @classmethod
    def of(cls, flow) -> "FlowRef":
        """The reference to a flow-table ``Flow`` (client and server as the table decided them)."""
        return cls(endpoint(*flow.client), endpoint(*flow.server), flow.iface)

    @property
    def of_one_connection(self) -> bool:
        """Whether it names one connection (a caller, or an interface it was seen on): findings of one
        server without either group over pods (core/groups.py)."""
        return self.client != "-" or bool(self.iface)

    def text(self, labelled: bool = True) -> str:
        """``flow: client -> server on iface``, ``... (from Envoy's logs)`` with no interface; without the
        ``flow:`` when not ``labelled``."""
        client = self.client if self.client != "-" else "(caller not logged)"
        server = self.server if self.server != "-" else "(upstream not logged)"
        # With no interface it came from an access-log line: Envoy's addresses, seen on no interface.
        said = f"{client} -> {server} " + (f"on {self.iface}" if self.iface else "(from Envoy's logs)")
        return f"flow: {said}" if labelled else said

    def to_dict(self) -> dict:
        return {"client": self.client, "server": self.server, "iface": self.iface}


@dataclass(frozen=True, slots=True)
class NoFlow:
    """What a finding about no connection is about: a pod's spec (``kind`` SPEC, lint: ``server`` the pod's
    ``ip:port``, port ``-`` when the rule names none) or Envoy's counters or /clusters (``kind`` COUNTER:
    ``server`` the cluster, listener or ``istio_requests_total``). It has no client and no interface; the JSON
    report keeps a flow's shape for it (client ``-``, iface empty: docs/DESIGN.md)."""

    kind: str
    server: str

    of_one_connection = False

    def text(self, labelled: bool = True) -> str:
        """``where: 10.0.0.7:5000 (the pod's spec: no connection)`` or ``where: inbound|5000|| (...)``; without
        the ``where:`` when not ``labelled``."""
        of = "the pod's spec" if self.kind == SPEC else "Envoy's counters"
        said = f"{self.server} ({of}: no connection)"
        return f"where: {said}" if labelled else said

    def to_dict(self) -> dict:
        return {"client": "-", "server": self.server, "iface": ""}


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector's conclusion. Field names are the `-o json` report contract of docs/DESIGN.md."""

    detector: str
    severity: Severity
    title: str
    flow: FlowRef | NoFlow  # NoFlow: a finding of a pod's spec or of Envoy's counters
    evidence: tuple[Evidence, ...]
    envoy_flags: tuple[str, ...] = ()
    response_code_details: str = ""  # Envoy's %RESPONSE_CODE_DETAILS% for the requests this explains
    explanation: str = ""
    remediation: str = ""
    pod: str | None = None
    ts: float = 0.0  # when the deciding packet was seen, seconds since the epoch
    details: dict = field(default_factory=dict, hash=False, compare=False)
    # What tells this finding from others of its detector on the same server: the framing violation, the cause
    # of a refusal. Findings alike in severity, detector, pod, server, flags and variant are one group
    # (core/groups.py): one problem seen many times. Empty when the detector has one kind of finding.
    variant: str = ""
    access_log: tuple[str, ...] = ()  # the sidecar's access-log lines this finding explains, as logged
    # The Envoy and kernel counters that back it and moved during the run, by name.
    counters: dict = field(default_factory=dict, hash=False, compare=False)
    # The fixes, in the order printed (core/fixes.py); ``remediation`` is their text when not given.
    fixes: tuple[Fix, ...] = ()
    envoy_log: tuple[str, ...] = ()  # the lines of Envoy's own (debug) log this finding rests on, as logged
    # ``access_log``'s lines as the pipeline parsed them (envoy.access_log.AccessLogEntry, in its order; None where
    # a line came without its parse), in whatever format they were read (--log-format's too). Not in the report.
    entries: tuple = field(default=(), hash=False, compare=False, repr=False)

    @property
    def connection(self) -> FlowRef | None:
        """The connection it is about; None for a finding of no connection (a pod's spec, Envoy's counters)."""
        return self.flow if isinstance(self.flow, FlowRef) else None

    @property
    def stands_on(self) -> tuple[str, ...]:
        """The kinds of evidence this finding rests on, in a fixed order: "packets", "access-log", "envoy-log",
        "counters", "spec" (the report's ``stands_on``)."""
        kinds = {e.kind for e in self.evidence}
        return tuple(name for name, there in (
            ("packets", PACKET in kinds), ("access-log", ACCESS_LOG in kinds or bool(self.access_log)),
            ("envoy-log", ENVOY_LOG in kinds or bool(self.envoy_log)),
            ("counters", COUNTER in kinds or bool(self.counters)), ("spec", SPEC in kinds)) if there)

    def __post_init__(self) -> None:
        if self.fixes and not self.remediation:
            object.__setattr__(self, "remediation", render(self.fixes))

    def quoted_lines(self) -> list[tuple[str, object]]:
        """``access_log`` as (line, its parsed AccessLogEntry or None) pairs."""
        known = self.entries if len(self.entries) == len(self.access_log) else (None,) * len(self.access_log)
        return list(zip(self.access_log, known))

    def with_lines(self, lines) -> "Finding":
        """This finding quoting ``lines`` too ((line, parsed entry or None) pairs), those it quotes already left
        out."""
        pairs = self.quoted_lines()
        have = set(self.access_log)
        for text, entry in lines:
            if text not in have:
                have.add(text)
                pairs.append((text, entry))
        return replace(self, access_log=tuple(t for t, _ in pairs), entries=tuple(e for _, e in pairs))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("entries")
        d["severity"] = self.severity.value
        d["flow"] = self.flow.to_dict()
        d["envoy_flags"] = list(self.envoy_flags)
        d["evidence"] = [e.to_dict() for e in self.evidence]
        d["stands_on"] = list(self.stands_on)
        if self.pod is None:
            d.pop("pod")
        for optional in ("details", "access_log", "envoy_log", "counters", "variant", "fixes"):
            if not d[optional]:
                d.pop(optional)
            elif optional in ("access_log", "envoy_log"):
                d[optional] = list(getattr(self, optional))
            elif optional == "fixes":
                d[optional] = [fix.to_dict() for fix in self.fixes]
        return d


@dataclass(frozen=True, slots=True)
class Problem:
    """Input trouble that did not stop the run (a capture cut short, a lost stream, an unreachable Envoy admin):
    ``where`` it happened (a file, ``pod/NAME IFACE``), ``what`` happened, one line each. A capture cut short
    also says after which frame (``cut_after_frame``). Not a finding: it says what the run could not see."""

    where: str
    what: str
    cut_after_frame: int | None = None

    def to_dict(self) -> dict:
        """The report's ``problems[]`` entry (docs/DESIGN.md, report schema)."""
        out: dict = {"where": self.where, "what": self.what}
        if self.cut_after_frame is not None:
            out["cut_after_frame"] = self.cut_after_frame
        return out

    def line(self) -> str:
        return f"{self.where}: {self.what}"


def undissectable_problem(where: str, count: int, frames: tuple[int, ...]) -> Problem:
    """The problem of ``count`` TCP frames tshark could not dissect, naming the first of them by number."""
    named = ", ".join(map(str, frames)) + (", ..." if count > len(frames) else "")
    return Problem(where, f"{count} TCP frame{'s' if count != 1 else ''} tshark could not dissect (frame "
                          f"{named}: a header shorter than TCP's, or captured short): skipped, the rest analysed")


def payload_cut_problem(where: str, count: int) -> Problem:
    """The problem of ``count`` live frames whose payload was read from the first bytes tshark's line shows
    (sources/tshark_columns.py: the record was no longer held, or tshark reassembled it from IP fragments)."""
    frames = "1 frame's payload was" if count == 1 else f"{count} frames' payloads were"
    return Problem(where, f"{frames} read from the first 36 bytes tshark showed (no longer held, or reassembled "
                          "from IP fragments): an HTTP/1 or TLS start there is read as if captured that short")
