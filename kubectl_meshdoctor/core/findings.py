"""Findings: what a detector concluded, with the evidence that proves it and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True, slots=True)
class Evidence:
    """One packet, log line, counter or spec field that a finding rests on; ``kind`` says which (PACKET,
    ACCESS_LOG, ENVOY_LOG, COUNTER, SPEC). ``frame`` is the packet's frame number in ``source``, or the log
    line's 1-based line number there; 0 for a counter or a spec field.

    For a packet, ``src``/``dst`` are its ``ip:port`` endpoints and ``flags`` its tcpdump-style flags (``S``,
    ``R.``); they are empty for the other kinds, which the ladder diagram shows as notes."""

    source: str
    iface: str
    frame: int
    ts: float
    what: str
    src: str = ""
    dst: str = ""
    flags: str = ""
    payload_len: int = 0  # bytes
    kind: str = PACKET

    @classmethod
    def of(cls, ev: PacketEvent, what: str) -> "Evidence":
        """Evidence pointing at the packet ``ev``."""
        return cls(ev.source, ev.iface, ev.frame, ev.ts, what, ev.src_endpoint, ev.dst_endpoint, ev.flags.short(),
                   ev.payload_len)


@dataclass(frozen=True, slots=True)
class FlowRef:
    """The connection a finding is about: client and server as ``ip:port``, and the interface it was seen on."""

    client: str
    server: str
    iface: str

    @classmethod
    def of(cls, flow) -> "FlowRef":
        """The reference to a flow-table ``Flow`` (client and server as the table decided them)."""
        return cls(endpoint(*flow.client), endpoint(*flow.server), flow.iface)

    @property
    def of_spec(self) -> bool:
        """A finding of a pod's spec (lint), not of a connection: no client, no interface; ``server`` is the
        pod's address and port."""
        return self.client == "-" and not self.iface


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector's conclusion. Field names are the `-o json` report contract of docs/DESIGN.md."""

    detector: str
    severity: Severity
    title: str
    flow: FlowRef
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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["severity"] = self.severity.value
        d["envoy_flags"] = list(self.envoy_flags)
        d["evidence"] = [asdict(e) for e in self.evidence]
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
