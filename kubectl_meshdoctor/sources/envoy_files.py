"""What people already hold of a sidecar, read offline: its log (`kubectl logs POD -c istio-proxy`) and admin
dumps (`/stats`, `/clusters` in text or JSON). The log holds the access log, in any default format Istio or Envoy
shipped or the mesh's own, TEXT or JSON (envoy/access_log.py), and Envoy's own component log, at debug or not, in
any of its shapes (envoy/component_log.py); either wrapped as tools wrap it: --timestamps, --prefix, stern, CRI and
Docker files, grep (envoy/wrappers.py).

The log becomes the same AccessLogEvents and EnvoyLogEvents `watch` makes from the followed log, so the
detectors and the correlator see one shape from both; `/stats` dumps become the counters that moved, in
`watch`'s shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.events import AccessLogEvent, EnvoyCountersEvent, EnvoyLogEvent
from kubectl_meshdoctor.envoy.access_log import PARTIAL, layers_for, looks_like_access_log, read_layers
from kubectl_meshdoctor.envoy.clusters import Cluster, FormatError, parse_clusters
from kubectl_meshdoctor.envoy.component_facts import fact_of
from kubectl_meshdoctor.envoy.component_log import (
    ComponentLine,
    ComponentLogReader,
    is_continuation,
    parse_component_stages,
)
from kubectl_meshdoctor.envoy.log_format import LogFormat
from kubectl_meshdoctor.envoy.pasted_dump import unpasted_body
from kubectl_meshdoctor.envoy.stats import by_cluster, cluster_failures, cluster_stats_visible, delta, parse_stats
from kubectl_meshdoctor.envoy.story import log_ref
from kubectl_meshdoctor.envoy.wrappers import Unwrapped

from .merge import Gate

BATCH_LINES = 5_000  # lines read between two turns at the merge's gate: the log never sits whole in memory
MAX_PRETTY = 300  # lines of one pretty-printed JSON access-log line (Istio's JSON has ~25 keys)
MAX_JOINED = 1 << 20  # the pieces of one split line (CRI `P`, Docker's 16 KiB pieces) held at most
MAX_LINE = 1 << 20  # characters of one line held at most: a longer one (a gzip bomb's zeros) is skipped, counted
MAX_DUMP = 64 << 20  # characters of one /stats or /clusters dump read at most: ~1,000 clusters of full stats is ~15 MB


@dataclass(slots=True)
class LogRead:
    """What reading one log gave: ``lines`` read (of a log of several pods' lines, those of the pod read); ``entries`` among them that are access-log lines;
    ``component`` entries of Envoy's own log (a multi-line entry counts once), ``facts`` among them that a
    detector reads; ``unreadable`` lines that start as access-log lines do but give no entry (damaged, or
    written by no Envoy), the first of them at line ``first_unreadable``; ``partial`` entries read in part (a
    line of Envoy's shape that no format reads whole), the first at line ``first_partial``; ``other`` lines of no
    known kind (pilot-agent's, an app's, another program's), counted and skipped."""

    lines: int = 0
    entries: int = 0
    component: int = 0
    facts: int = 0
    unreadable: int = 0
    first_unreadable: int | None = None
    partial: int = 0
    too_long: int = 0  # lines longer than MAX_LINE, skipped unread
    first_too_long: int | None = None
    first_partial: int | None = None
    other: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def readable(self) -> bool:
        """Whether anything in the file was Envoy's: an access-log line or a component-log entry."""
        return bool(self.entries or self.component)


def open_text(path: str):
    """A text file, gzip-compressed or not (by its magic), as lines; undecodable bytes are replaced. A
    byte-order mark says the encoding (UTF-16, as Windows PowerShell's ``>`` writes; UTF-8 with a BOM, as
    Windows editors save), else UTF-8."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    if gz:
        with gzip.open(path, "rb") as fh:
            encoding = text_encoding(fh.read(4))
        return gzip.open(path, "rt", encoding=encoding, errors="replace")
    with open(path, "rb") as fh:
        encoding = text_encoding(fh.read(4))
    return open(path, encoding=encoding, errors="replace")


def text_encoding(head: bytes) -> str:
    """The encoding a file's first bytes' byte-order mark names (utf-8-sig drops a UTF-8 one), UTF-8 without."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "utf-16"
    return "utf-8-sig" if head[:3] == b"\xef\xbb\xbf" else "utf-8"


def event_of(entry, path: str, line: int) -> AccessLogEvent:
    # Envoy writes a line when the request ends: its end time is where the line belongs among the packets.
    return AccessLogEvent(entry.ts + entry.duration_ms / 1000.0, entry, path, line)


class _ComponentPusher:
    """Component-log entries of one file to EnvoyLogEvents; a line without a time takes the last time seen,
    so the events stay in the order the merge with the captures expects. Each pod a wrapper names (`kubectl logs
    -l ... --prefix` interleaves several sidecars' lines) has a reader of its own, so its multi-line entries are
    joined apart, and its events name it: connection ids are each Envoy's own."""

    def __init__(self, path: str, push: Callable, result: LogRead) -> None:
        self.path, self.push, self.result = path, push, result
        self.readers: dict[str | None, ComponentLogReader] = {}
        self.last_ts = 0.0

    def reader(self, pod: str | None) -> ComponentLogReader:
        reader = self.readers.get(pod)
        if reader is None:
            reader = self.readers[pod] = ComponentLogReader()
        return reader

    def take(self, done: list[tuple[int, ComponentLine]], pod: str | None) -> None:
        for number, entry in done:
            self.result.component += 1
            if entry.ts is not None:
                self.last_ts = entry.ts
            fact = fact_of(entry)
            if fact is not None:
                self.result.facts += 1
                self.push(EnvoyLogEvent(entry.ts or self.last_ts, fact, log_ref(self.path, number, entry,
                                                                                    fact.kind), pod))

    def flush(self) -> None:
        for pod, reader in self.readers.items():
            self.take(reader.flush(), pod)


async def read_access_log(path: str, push: Callable[[AccessLogEvent | EnvoyLogEvent], None], gate: Gate,
                          log_format: LogFormat | None = None, only_pod: str | None = None,
                          except_pods: frozenset[str] = frozenset()) -> LogRead:
    """Push an AccessLogEvent for every access-log line of ``path`` and an EnvoyLogEvent for every fact of
    Envoy's component log in it, in file order, awaiting ``gate`` between batches (sources/merge.py: a log that
    runs ahead of the captures waits for them). ``log_format``: the mesh's own format (analyze --log-format),
    tried before the known ones. The pieces of a line a container runtime split (CRI `P`, Docker json-file's
    16 KiB pieces) are joined, and read as one line at the first piece's line number. Lines of no known kind
    are counted and skipped. A log of several pods' lines (kubectl --prefix, sources/log_pods.py) is read once
    a pod: ``only_pod``, just the lines a wrapper says are that pod's; ``except_pods``, every line but those of
    these pods (the line numbers stay the file's). Raises OSError when the file cannot be read."""
    result = LogRead()
    component = _ComponentPusher(path, push, result)
    pretty = _PrettyJson()
    pieces: list[str] = []
    first_piece = 0
    position = 0  # the file's line number; ``result.lines`` counts only the lines this read keeps
    with open_text(path) as fh:
        while True:
            await gate()
            batch, cut = await asyncio.to_thread(_lines, fh, BATCH_LINES)
            for line in batch:
                position += 1
                if line is None:  # longer than MAX_LINE: skipped, its memory never held
                    result.lines += 1  # whose it is cannot be told unread: counted for every pod reading the file
                    result.too_long += 1
                    result.first_too_long = result.first_too_long or position
                    continue
                raw = line.rstrip("\r\n")
                layers = layers_for(raw, log_format)
                u = layers[-1]
                if (only_pod is not None and u.pod != only_pod) or (except_pods and u.pod in except_pods):
                    continue  # another pod's line: read with that pod's files
                result.lines += 1
                if u.partial:
                    first_piece = first_piece or position
                    pieces.append(u.text)
                    if sum(map(len, pieces)) > MAX_JOINED:  # no line of Envoy's is that long
                        _unreadable(result, first_piece)
                        pieces, first_piece = [], 0
                    continue
                number = position
                if pieces:
                    u = dataclasses.replace(u, text="".join(pieces) + u.text)
                    raw, number, layers = u.text, first_piece, (u,)
                    pieces, first_piece = [], 0
                for one in pretty.take(layers, raw, number):
                    _read_one(result, *one, path, push, log_format, component)
            if cut is not None:  # a compressed log cut short, or its checksum wrong: every line before it read
                result.problems.append(f"log cut short after line {position} ({cut}); analysed up to there")
                break
            if not batch:
                break
    for one in pretty.flush():
        _read_one(result, *one, path, push, log_format, component)
    component.flush()
    if pieces:
        result.problems.append(f"the log ends in the middle of a line split by the container runtime (from line "
                               f"{first_piece}); that line was not read")
    if result.unreadable:
        # The count and where, never the text: a hostile line is the user's to open, not ours to print.
        result.problems.append(f"{result.unreadable} line(s) that start as access-log lines could not be read "
                               f"and were skipped; the first is line {result.first_unreadable}")
    if result.too_long:
        result.problems.append(f"{result.too_long} line(s) longer than {MAX_LINE >> 20} MiB were skipped unread "
                               f"(no line of Envoy's is that long); the first is line {result.first_too_long}")
    if result.partial:
        result.problems.append(f"{result.partial} line(s) match no known access-log format whole and were read in "
                               f"part (time, request, code, flags, details); the first is line "
                               f"{result.first_partial}: give the mesh's format with --log-format to read them "
                               f"whole")
    if not result.readable:
        whose = (f"the {result.lines} line(s) of pod {only_pod}" if only_pod is not None else
                 f"the {result.lines} line(s) no prefix gives to another pod" if except_pods else
                 f"its {result.lines} line(s)")
        result.problems.append(f"nothing of Envoy's in {whose}: no access-log line (Istio's or "
                               f"Envoy's formats, TEXT or JSON, or the one --log-format gives; is access logging "
                               f"on: meshConfig.accessLogFile?) and no line of Envoy's own log")
    elif result.entries == 0 and result.facts == 0:
        result.problems.append("Envoy's own log at its default levels and no access-log line: raise the levels "
                               "the detectors read (kubectl meshdoctor watch --envoy-debug, or kubectl "
                               "meshdoctor log-level POD --level connection:debug,pool:debug,router:debug,"
                               "http:debug) and capture the log again")
    return result


class _PrettyJson:
    """A JSON access-log line that `jq` (or a ticket) printed over several lines, joined back into one: from a line
    that is ``{`` alone to the ``}`` that closes it, at most MAX_PRETTY lines. Anything else passes through."""

    def __init__(self) -> None:
        self._held: list[tuple[tuple[Unwrapped, ...], str, int]] = []

    def take(self, layers: tuple[Unwrapped, ...], raw: str, number: int) -> list:
        """The lines to read now (each ``(layers, raw, number)``): this one, or a joined object, or none yet."""
        text = layers[-1].text.strip()
        if not self._held:
            if text == "{":
                self._held.append((layers, raw, number))
                return []
            return [(layers, raw, number)]
        self._held.append((layers, raw, number))
        if text.startswith("}"):
            joined = " ".join(held[0][-1].text.strip() for held in self._held).rstrip(",")
            try:
                doc = json.loads(joined)
            except (ValueError, RecursionError):
                doc = None
            if isinstance(doc, dict):
                first = self._held[0]
                self._held = []
                one = Unwrapped(json.dumps(doc), *(first[0][-1].ts, first[0][-1].pod, first[0][-1].container),
                                wrappers=(*first[0][-1].wrappers, "pretty-json"))
                return [((one,), joined, first[2])]
        return self.flush() if len(self._held) > MAX_PRETTY else []

    def flush(self) -> list:
        held, self._held = self._held, []
        return held


def _read_one(result: LogRead, layers: tuple[Unwrapped, ...], raw: str, number: int, path: str,
              push: Callable[[AccessLogEvent], None], log_format: LogFormat | None,
              component: _ComponentPusher) -> None:
    u = layers[-1]
    head = parse_component_stages(x.text for x in reversed(layers))
    reader = component.reader(u.pod)
    if head is not None or (reader.open and is_continuation(u.text)):
        component.take(reader.feed(u.text, number, head), u.pod)
        return
    component.take(reader.flush(), u.pod)
    read = read_layers(layers, raw, log_format)
    if read is not None:
        result.entries += 1
        if read.format == PARTIAL:
            result.partial += 1
            result.first_partial = result.first_partial or number
        push(event_of(read.entry, path, number))
    elif looks_like_access_log(u.text):
        _unreadable(result, number)
    elif u.text.strip():
        result.other += 1


def _unreadable(result: LogRead, number: int) -> None:
    result.unreadable += 1
    result.first_unreadable = result.first_unreadable or number


def _lines(fh, n: int) -> tuple[list[str | None], BaseException | None]:
    """Up to ``n`` lines of ``fh``, and the error that ended a compressed file early (None if none): the lines
    before it are the caller's all the same. A line longer than MAX_LINE is None, read past in MAX_LINE pieces
    so that no more than that is ever held."""
    out: list[str | None] = []
    try:
        while len(out) < n:
            line = fh.readline(MAX_LINE)
            if not line:
                break
            if len(line) >= MAX_LINE and not line.endswith("\n"):
                while line and not line.endswith("\n"):
                    line = fh.readline(MAX_LINE)
                out.append(None)
                continue
            out.append(line)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        return out, e
    return out, None


def read_counters(stats_paths: list[str], ts: float) -> tuple[EnvoyCountersEvent, list[str]]:
    """The counters of `/stats` dumps as `watch` hands them on, and what the reader had to decide about them
    (one line each): between the earliest dump and the latest when there are several, else every counter of
    the one dump, which counts since Envoy started (``uptime_s`` from its ``server.uptime``); ``moved`` keeps,
    per cluster, those that explain failures (envoy.stats.CLUSTER_FAILURE_STATS). Dumps are ordered by their
    ``server.uptime``, then by how far their counters went (a shell's glob puts stats-after before stats-before);
    when a counter went back between them (another Envoy, or this one restarted) only the latest is read, since
    its start. Raises
    envoy.clusters.FormatError for a body that is not /stats, OSError for an unreadable file."""
    dumps = []
    notes: list[str] = []
    for path in stats_paths:
        dumps.append((path, parse_stats(unpasted_body(_read_dump(path, notes)))))
    if dumps and not any(cluster_stats_visible(d) for _, d in dumps):
        notes.append("no per-cluster counter (cluster.inbound|... or cluster.outbound|...) in it: Istio's default "
                     "stats inclusion list hides them, so their failures cannot show here; include them "
                     "(proxyStatsMatcher inclusionPrefixes: [\"cluster.\"], then restart the pod) or give the "
                     "sidecar's access log")
    if len(dumps) > 1 and all(_uptime(d) is not None for _, d in dumps):
        # server.uptime moves only at a stats flush (5 s): two dumps a round apart may share it, and then the
        # later is the one whose counters have grown, not the one a glob names first
        dumps = sorted(dumps, key=lambda pd: (_uptime(pd[1]) or 0.0,
                                              sum(v for v in pd[1].values() if isinstance(v, int))))
    if len(dumps) > 1:
        flat = delta(dumps[0][1], dumps[-1][1])
        went_back = sorted(k for k, v in flat.items() if v < 0 and k.endswith("_total"))
        if not went_back:
            flat = {k: v for k, v in flat.items() if v > 0}  # gauges that fell are no failure of the run
            moved = {cluster: {k: v for k, v in stats.items() if isinstance(v, int)}
                     for cluster, stats in by_cluster(flat).items()}
            return (EnvoyCountersEvent(ts, moved, flat, "the first dump", _uptime(dumps[-1][1]),
                                       ", ".join(p for p, _ in dumps)), notes)
        notes.append(f"counters went back between the dumps ({went_back[0]}, and {len(went_back) - 1} more): "
                     f"another Envoy, or one that restarted; only {dumps[-1][0]} is read, since its start")
        dumps = dumps[-1:]
    source = ", ".join(p for p, _ in dumps)
    one = dumps[0][1] if dumps else {}
    flat = {k: v for k, v in one.items() if isinstance(v, int) and v}
    # One dump holds totals since Envoy started, gauges among them: only the counters that explain failures.
    moved = {cluster: {k: v for k, v in stats.items() if v} for cluster, stats in cluster_failures(one).items()}
    return EnvoyCountersEvent(ts, moved, flat, "Envoy's start", _uptime(one), source), notes


def _uptime(stats: dict) -> float | None:
    value = stats.get("server.uptime")
    return float(value) if isinstance(value, int) else None


def read_clusters(path: str) -> dict[str, Cluster]:
    """A `/clusters` dump (text or JSON), also as pasted into a ticket (envoy/pasted_dump.py). Raises envoy.clusters.FormatError, OSError."""
    return parse_clusters(unpasted_body(_read_dump(path, [])))


def _read_dump(path: str, notes: list[str]) -> str:
    """A dump's text, at most MAX_DUMP characters of it (cut at a line end, with a note): a gzip bomb must not
    take the machine's memory. Raises OSError, and FormatError for a compressed dump cut short."""
    with open_text(path) as fh:
        try:
            text = fh.read(MAX_DUMP + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise FormatError(f"{path}: compressed file cut short or damaged ({e})") from None
    if len(text) > MAX_DUMP:
        text = text[:MAX_DUMP].rpartition("\n")[0]
        notes.append(f"{path} is larger than {MAX_DUMP >> 20} MiB: only its first {MAX_DUMP >> 20} MiB were read")
    return text


def clusters_summary(clusters: dict[str, Cluster]) -> dict[str, dict]:
    """For the report: per cluster its hosts, and those Envoy does not route to with the reason it gives
    (health flags: failed_outlier_check is an outlier ejection, failed_active_hc a failed health check)."""
    return {name: {"hosts": len(c.hosts),
                   "unhealthy": {h.endpoint: list(h.health_flags) for h in c.hosts if not h.healthy}}
            for name, c in clusters.items()}
