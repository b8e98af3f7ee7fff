"""The report of a run, typed: what was read (the source), the sidecar's side, the kernel's, the findings and
their groups, the problems; ``Report.to_dict`` is the ``-o json`` contract of docs/DESIGN.md ("Report"), field
by field (tests/frontends/report/test_schema.py). The text, markdown and JSON writers (frontends/report.py) and the TUI read
this model; each command builds it from its own typed parts, none as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubectl_meshdoctor import __version__
from kubectl_meshdoctor.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE

from .envoy_debug_report import EnvoyDebugReport
from .findings import Finding, Problem, Severity
from .groups import FindingGroup, group_findings
from .hop_path import hop_of
from .hops import LoggedLine, join_hops
from .pipeline import PipelineStats
from .unseen import Unseen, unseen
from .upstream_pod import HeldPod, point_to_upstream

# -- what was read ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LintSource:
    """``lint``: the pods whose specs were checked, as ``namespace/name``."""

    pods: tuple[str, ...]

    kind = "lint"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "pods": list(self.pods)}


@dataclass(frozen=True, slots=True)
class FilesSource:
    """``analyze``: the files read, in the order given. ``kinds`` (path -> capture, envoy-log, stats or
    clusters) when any is not a capture; None when every one is (the kind is then ``pcap``). A run that names
    pods (``analyze DIR...``, ``FILE:POD/IFACE``) has each pod's own source in ``per_pod``: its ``pod`` and the
    ``interfaces`` its captures were read as (path -> lo, eth0, ...)."""

    files: tuple[str, ...]
    kinds: dict[str, str] | None = None
    pod: str | None = None
    interfaces: dict[str, str] | None = None
    per_pod: tuple[FilesSource, ...] = ()

    @property
    def kind(self) -> str:
        return "pcap" if self.kinds is None else "files"

    @classmethod
    def merged(cls, sources: list[FilesSource]) -> FilesSource:
        """One source for several pods' (each naming its pod): every file once, in order, and each pod's."""
        files = tuple(dict.fromkeys(f for s in sources for f in s.files))
        kinds = {f: k for s in sources for f, k in (s.kinds or dict.fromkeys(s.files, "capture")).items()}
        return cls(files, None if all(s.kinds is None for s in sources) else kinds, per_pod=tuple(sources))

    def to_dict(self) -> dict:
        out: dict = {"kind": self.kind, "files": list(self.files)}
        if self.kinds is not None:
            out["kinds"] = dict(self.kinds)
        if self.pod is not None:
            out["pod"] = self.pod
        if self.interfaces is not None:
            out["interfaces"] = dict(self.interfaces)
        if self.per_pod:
            out["pods"] = [s.pod for s in self.per_pod]
            out["per_pod"] = [s.to_dict() for s in self.per_pod]
        return out


@dataclass(frozen=True, slots=True)
class CaptureCounts:
    """One interface's capture in a pod: tcpdump's counts (``captured``, ``dropped_by_kernel``; None when it
    did not say), the frames tshark read, and the bytes the exec stream carried."""

    captured: int | None
    dropped_by_kernel: int | None
    frames_read: int | None
    bytes: int | None

    def to_dict(self) -> dict:
        return {"captured": self.captured, "dropped_by_kernel": self.dropped_by_kernel,
                "frames_read": self.frames_read, "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class PodCapture:
    """How one pod was captured: the debug ``container`` (and whether an earlier run's was reused), the
    ``interfaces`` asked for and each one's ``captures``, ``capture_filter`` (``lean`` or ``full``),
    ``dissect`` (``local`` or ``pod``), and ``files`` (interface -> path) with --write-pcap."""

    container: str
    container_reused: bool
    interfaces: tuple[str, ...]
    captures: dict[str, CaptureCounts]
    capture_filter: str
    dissect: str
    files: dict[str, str] | None = None

    def to_dict(self) -> dict:
        return {"container": self.container, "container_reused": self.container_reused,
                "interfaces": list(self.interfaces), "captures": {k: c.to_dict() for k, c in self.captures.items()},
                "capture_filter": self.capture_filter, "dissect": self.dissect,
                **({"files": dict(self.files)} if self.files else {})}


@dataclass(frozen=True, slots=True)
class LiveSource:
    """``watch``: the ``pods`` and their ``namespace``; one pod's ``capture``; for several, each pod's own
    source in ``per_pod``; ``ended`` (``stopped``) for a run the API server held past its stop."""

    pods: tuple[str, ...]
    namespace: str
    capture: PodCapture | None = None
    per_pod: tuple[LiveSource, ...] = ()
    ended: str | None = None

    kind = "live"

    @classmethod
    def merged(cls, sources: list[LiveSource]) -> LiveSource:
        """One source for several pods' (at least one): their pods in order, the first one's namespace."""
        return cls(tuple(s.pods[0] for s in sources), sources[0].namespace, per_pod=tuple(sources))

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "pods": list(self.pods), "namespace": self.namespace,
               **(self.capture.to_dict() if self.capture is not None else {})}
        if self.per_pod:
            out["per_pod"] = [s.to_dict() for s in self.per_pod]
        if self.ended is not None:
            out["ended"] = self.ended
        return out


@dataclass(frozen=True, slots=True)
class ScreenSource:
    """The TUI's report of a run still going (its export): ``describe`` says what the screen shows."""

    describe: str

    kind = "watch"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "describe": self.describe}


ReportSource = LintSource | FilesSource | LiveSource | ScreenSource

# -- the sidecar's side -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogLinesRead:
    """What the Envoy logs read held (the followed log live, the files offline): access-log lines, every line,
    entries of Envoy's own log, those a detector reads (facts), lines of no known kind."""

    access_log_lines: int = 0
    log_lines: int = 0
    component_log_entries: int = 0
    envoy_log_facts: int = 0
    other_log_lines: int = 0

    def to_dict(self) -> dict:
        return {"access_log_lines": self.access_log_lines, "log_lines": self.log_lines,
                "component_log_entries": self.component_log_entries, "envoy_log_facts": self.envoy_log_facts,
                "other_log_lines": self.other_log_lines}


@dataclass(frozen=True, slots=True)
class SidecarSide:
    """One pod's sidecar in a watch: Envoy's ``version`` (None when /server_info did not say), the counters
    that moved over the run (cluster -> stat -> delta), the log lines read, and what --envoy-debug did."""

    version: str | None
    counters_moved: dict[str, dict[str, int]]
    logs: LogLinesRead = LogLinesRead()
    debug: EnvoyDebugReport | None = None

    def debug_reports(self) -> list[EnvoyDebugReport]:
        return [self.debug] if self.debug is not None else []

    def to_dict(self) -> dict:
        return {"version": self.version, "counters_moved": self.counters_moved, **self.logs.to_dict(),
                **({"debug": self.debug.to_dict()} if self.debug is not None else {})}


@dataclass(frozen=True, slots=True)
class DumpCounters:
    """The counters of `/stats` dumps offline: cluster -> stat -> delta; ``since`` ``first dump`` (two dumps or
    more: between the first and the last) or ``Envoy's start`` (one dump); ``uptime_s`` when a dump said it."""

    moved: dict[str, dict[str, int]]
    since: str
    uptime_s: float | None = None


@dataclass(frozen=True, slots=True)
class FilesSide:
    """Envoy's side of an offline run: the logs read, the `/stats` dumps' counters, the `/clusters` dumps'
    clusters (name -> ``{"hosts": n, "unhealthy": {host: [flags]}}``)."""

    logs: LogLinesRead
    counters: DumpCounters | None = None
    clusters: dict[str, dict] | None = None

    def debug_reports(self) -> list[EnvoyDebugReport]:
        return []

    def to_dict(self) -> dict:
        out: dict = self.logs.to_dict()
        if self.counters is not None:
            out["counters_moved"] = self.counters.moved
            out["counters_since"] = self.counters.since
            if self.counters.uptime_s is not None:
                out["uptime_s"] = self.counters.uptime_s
        if self.clusters:
            out["clusters"] = self.clusters
        return out


@dataclass(frozen=True, slots=True)
class PerPodSide:
    """Several pods' sidecars (a watch of deploy/x or -l; their files, analyze over several pods): pod name ->
    its side."""

    per_pod: dict[str, SidecarSide | FilesSide]

    def debug_reports(self) -> list[EnvoyDebugReport]:
        return [d for side in self.per_pod.values() for d in side.debug_reports()]

    def to_dict(self) -> dict:
        return {"per_pod": {name: side.to_dict() for name, side in self.per_pod.items()}}


EnvoySide = SidecarSide | FilesSide | PerPodSide


@dataclass(frozen=True, slots=True)
class KernelSide:
    """The kernel counters of the pod's network namespace that moved over the run (nstat name -> delta; for
    several pods ``pod/name``)."""

    moved: dict[str, int]

    def to_dict(self) -> dict:
        return dict(self.moved)


# -- the report -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    """Everything a run concluded: what was read (``source``), the counts, the findings (each instance; the
    groups are derived), the ``problems`` (input troubles that did not stop the run: a capture cut short, a lost
    stream), and for a run that read Envoy or the kernel their sides. ``captured_nothing``: no input was read
    (no interface's capture ever ran, no file held anything), so without an error finding the run exits 2."""

    source: ReportSource
    stats: PipelineStats
    findings: list[Finding]
    problems: list[Problem] = field(default_factory=list)
    envoy: EnvoySide | None = None
    kernel: KernelSide | None = None
    captured_nothing: bool = False
    # The 5xx answers a pod's sidecar logged that no finding quotes (Pipeline.logged): not in the report, for
    # merge_pod_reports to give to the other hop's finding of the same request.
    logged: tuple[LoggedLine, ...] = field(default=(), compare=False)
    # The pod's own IPs (Pipeline.addresses): not in the report, for merge_pod_reports to find a caller line's
    # upstream pod among the run's (core/upstream_pod.py).
    addresses: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        # Findings past the pipeline's MAX_FINDINGS are counted, not kept: a report must say that it is cut.
        dropped = self.stats.findings_dropped
        if dropped and not any(p.where == "findings" for p in self.problems):
            what = (f"{dropped} more findings than the {len(self.findings)} kept were concluded and are not listed "
                    f"(the groups' counts stop there too)")
            object.__setattr__(self, "problems", [*self.problems, Problem("findings", what)])

    @property
    def groups(self) -> list[FindingGroup]:
        """The findings as problems (core/groups.py): most severe first, then first seen."""
        return group_findings(self.findings)

    def debug_reports(self) -> list[EnvoyDebugReport]:
        """What --envoy-debug did to each sidecar's log levels (none offline)."""
        return self.envoy.debug_reports() if self.envoy is not None else []

    def unseen(self) -> list[Unseen]:
        """Each pod whose packets came from one of lo and eth0 only, with the classes only the other shows."""
        if isinstance(self.source, LintSource):
            return []
        return unseen({k: v.packets for k, v in self.stats.by_iface.items()}, self.stats.missed)

    def exit_code(self) -> int:
        """EXIT_FINDINGS for an error finding; else EXIT_USAGE when nothing was read, EXIT_OK otherwise."""
        if any(f.severity is Severity.ERROR for f in self.findings):
            return EXIT_FINDINGS
        return EXIT_USAGE if self.captured_nothing else EXIT_OK

    def to_dict(self) -> dict:
        """The ``-o json`` report (docs/DESIGN.md, "Report")."""
        st = self.stats
        return {
            "tool": "kubectl-meshdoctor",
            "version": __version__,
            "source": self.source.to_dict(),
            "stats": {
                "packets": st.packets,
                "flows": st.flows_seen,
                "duration_s": st.duration_s,
                "interfaces": {k: {"packets": v.packets} for k, v in sorted(st.by_iface.items())},
                # Every frame tshark read per stream; "packets" are those a detector could act on.
                "frames_read": dict(sorted(st.frames_read.items())),
            },
            "problems": [p.to_dict() for p in self.problems],
            # What the packets could not show: a pod with lo and no eth0, or eth0 and no lo (core/unseen.py).
            **({"not_seen": [u.to_dict() for u in unseen_]} if (unseen_ := self.unseen()) else {}),
            **({"envoy": self.envoy.to_dict()} if self.envoy is not None else {}),
            **({"kernel": self.kernel.to_dict()} if self.kernel is not None else {}),
            "findings": [with_hop(f) for f in self.findings],
            "groups": groups_to_dicts(self.findings),
        }


def group_pods(g: FindingGroup) -> list[str]:
    """The pods a group's findings are about, in order, each once (a lint rule fires on many pods)."""
    return list(dict.fromkeys(f.pod for f in g.instances if f.pod))


def with_hop(f: Finding) -> dict:
    """``f.to_dict()`` and, when it is known, its ``hop`` (core/hop_path.py): the leg of the request's path, that
    pod's place on it, and whether the leg between the pods was seen speaking mTLS."""
    d = f.to_dict()
    hop = hop_of(f)
    if hop is not None:
        d["hop"] = {"leg": hop.leg, "role": hop.role, "mtls": hop.mtls, "also": list(hop.also)}
    return d


def groups_to_dicts(findings: list[Finding]) -> list[dict]:
    """The report's ``groups``: one problem each (core/groups.py), its instances as indexes into ``findings``."""
    index = {id(f): i for i, f in enumerate(findings)}
    out = []
    for g in group_findings(findings):
        f = g.newest
        pods = group_pods(g)
        # A spec finding's group spans pods (lint -A): no one pod or server is its own.
        where = {"pods": pods} if len(pods) > 1 else {"pod": pods[0], "server": f.flow.server} if pods else \
            {"server": f.flow.server}
        out.append({"detector": f.detector, "severity": f.severity.value, **where,
                    "envoy_flags": list(f.envoy_flags), "variant": f.variant,
                    "label": g.label, "count": g.count, "first_ts": g.first_ts, "last_ts": g.last_ts,
                    "rate_per_min": g.rate_per_min, "instances": [index[id(i)] for i in g.instances],
                    **({"counters": g.counters} if g.counters else {})})
    return out


def merge_pod_reports(reports: list[Report], problems: list[Problem]) -> Report:
    """One report of analyze over pods (at least one), each ``reports`` item one pod's run through a pipeline of
    its own (its source a FilesSource naming its pod): every finding (each naming its pod) in time order, the
    problems of each, then ``problems`` (a pod none of whose files could be read). With several pods the
    interfaces count as ``pod/iface`` and each Envoy side is under ``envoy.per_pod``; one pod's report keeps its
    own (only its source says its pod)."""
    sources = [r.source for r in reports if isinstance(r.source, FilesSource)]
    if len(reports) == 1:
        r = reports[0]
        return Report(FilesSource.merged(sources), r.stats, r.findings, r.problems + problems, envoy=r.envoy,
                      captured_nothing=r.captured_nothing)
    stats = PipelineStats(missed=reports[0].stats.missed)  # each pod's pipeline loads the same detectors
    envoy: dict[str, SidecarSide | FilesSide] = {}
    for r, src in zip(reports, sources):
        stats.packets += r.stats.packets
        stats.flows_seen += r.stats.flows_seen
        stats.findings_dropped += r.stats.findings_dropped
        stats.by_iface.update({f"{src.pod}/{iface}": st for iface, st in r.stats.by_iface.items()})
        stats.frames_read.update(r.stats.frames_read)  # by file: each pod's files are its own
        if isinstance(r.envoy, (SidecarSide, FilesSide)):
            envoy[src.pod or ""] = r.envoy
    # A caller pod's relayed 5xx and the server pod's finding of the same request are one finding (core/hops.py).
    findings = join_hops(sorted((f for r in reports for f in r.findings), key=lambda f: f.ts),
                         [x for r in reports for x in r.logged])
    # A caller's 503 UC that asks to capture its upstream pod, which this run holds: where in the run to look.
    findings = point_to_upstream(findings, [HeldPod(src.pod, r.addresses, r.stats.by_iface)
                                            for r, src in zip(reports, sources) if src.pod is not None])
    return Report(FilesSource.merged(sources), stats, findings,
                  [p for r in reports for p in r.problems] + problems, envoy=PerPodSide(envoy) if envoy else None,
                  captured_nothing=all(r.captured_nothing for r in reports))
