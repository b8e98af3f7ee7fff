"""Which access-log lines of several sidecars are one request at one hop, and how the hops of a request chain.

A hop is a caller's sidecar's outbound line (its upstream the next pod) and the server pod's sidecar's inbound
line of the same request. Every hop of a chain (gateway -> a -> b) logs the same %REQ(X-REQUEST-ID)% (Envoy
generates it at the edge and keeps it, Envoy's http_conn_man/headers.rst; Istio asks apps to pass it on), and a
client may reuse one id (a fixed id, a retry), so an id alone does not say which hop. Lines pair one-to-one,
each line at most once, by the first rule that applies, the same method and path first, then the nearest in time:

1. the hop's four-tuple: the caller's %UPSTREAM_LOCAL_ADDRESS% is the server's %DOWNSTREAM_REMOTE_ADDRESS%
   (the connection's source, which the server sidecar accepted), ids equal when both logged one, the two
   starts within JOIN_WINDOW_S; on an HTTP/1.x connection both sides logged as many lines of, the k-th caller
   line with the k-th server line before the nearest (RFC 9112 section 9.3: answers in request order);
2. where either side did not log those: the caller's %UPSTREAM_HOST% is the server's
   %DOWNSTREAM_LOCAL_ADDRESS% (the server pod's IP:port, which the server's sidecar reads after istio-iptables'
   REDIRECT as SO_ORIGINAL_DST), the ids equal, the starts within JOIN_WINDOW_S;
3. where neither side logged those either: the id alone, when exactly one caller line and one server line
   carry it.

Within one pod a request goes on from its inbound line to the outbound line its app's call made for it: the
same id, the outbound's start within the inbound's span, the same pod (named, else the pod's IP: the inbound's
%DOWNSTREAM_LOCAL_ADDRESS% is the outbound's %UPSTREAM_LOCAL_ADDRESS%'s).

Indexed by address and by id, the pairing costs about one dictionary look-up a line.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry, parse_line
from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster

from .findings import Finding

JOIN_WINDOW_S = 5.0  # a caller's line and the server's of one request: the request's start, both clocks
SAME_CLOCK_S = 0.001  # a pod's own lines: one Envoy's clock, printed to the millisecond


@dataclass(frozen=True, slots=True)
class HopLine:
    """One access-log line in the join: ``pod`` its sidecar's pod (None when not named), ``entry`` parsed."""

    pod: str | None
    entry: AccessLogEntry


@dataclass(frozen=True, slots=True)
class HopLinks:
    """The links between lines, by their index in the list given: ``server_of`` a caller line -> the server line
    of its hop, ``caller_of`` the reverse; ``onward`` an inbound line -> its pod's outbound line of the same
    request, ``inward`` the reverse."""

    server_of: dict[int, int]
    caller_of: dict[int, int]
    onward: dict[int, int]
    inward: dict[int, int]

    def depth(self) -> dict[int, int]:
        """Each linked line's place on its request's path: 0 for the first caller's, one more each link on."""
        before = {**self.caller_of, **self.inward}
        out: dict[int, int] = {}
        for start in before:
            path = []
            k = start
            while k in before and k not in out and k not in path:
                path.append(k)
                k = before[k]
            d = out.get(k, 0)
            for k in reversed(path):
                d += 1
                out[k] = d
        for k in (*self.server_of, *self.onward):
            out.setdefault(k, 0)
        return out


def logged_entries(f: Finding) -> list[AccessLogEntry]:
    """``f``'s access-log lines as the pipeline parsed them (any format it read, --log-format's too); a line that
    came without its parse (a detector's own quote) read in the known formats, and left out when none fits."""
    return [e for _, e in parsed_lines(f)]


def parsed_lines(f: Finding) -> list[tuple[str, AccessLogEntry]]:
    """``f``'s access-log lines that could be read, each as quoted and parsed (logged_entries)."""
    out = []
    for text, entry in f.quoted_lines():
        if entry is None:
            entry = parse_line(text)
        if entry is not None:
            out.append((text, entry))
    return out


def direction(entry: AccessLogEntry) -> str | None:
    """``inbound`` or ``outbound``: the Istio cluster the line names (%UPSTREAM_CLUSTER%); None for another."""
    cluster = parse_istio_cluster(entry.upstream_cluster)
    return cluster.direction if cluster is not None else None


def caller_side(entry: AccessLogEntry) -> bool:
    """A caller's sidecar's line: its upstream is another pod (an outbound cluster, or a passthrough one)."""
    return direction(entry) != "inbound" and entry.upstream_cluster is not None


def server_sides(lines: Sequence[HopLine], callers: Sequence[int]) -> list[int]:
    """The lines (indices into ``lines``) of a server pod's sidecar taking a hop's connection in: those on an
    inbound cluster, and a listener's own line of no cluster (``0 NR filter_chain_not_found``: the connection
    matched no filter chain, so no request and no cluster) whose %DOWNSTREAM_REMOTE_ADDRESS% is a caller's
    %UPSTREAM_LOCAL_ADDRESS% or whose %DOWNSTREAM_LOCAL_ADDRESS% a caller's %UPSTREAM_HOST%."""
    sources = {lines[c].entry.upstream_local for c in callers} - {None}
    hosts = {lines[c].entry.upstream_host for c in callers} - {None}
    return [k for k, h in enumerate(lines) if direction(h.entry) == "inbound" or (
        h.entry.upstream_cluster is None and (h.entry.downstream_remote in sources
                                              or h.entry.downstream_local in hosts))]


def _ip(address: str | None) -> str | None:
    return address.rpartition(":")[0].strip("[]") if address and ":" in address else None


def _ids_agree(a: AccessLogEntry, b: AccessLogEntry) -> bool:
    return not (a.request_id and b.request_id) or a.request_id == b.request_id


def _greedy(candidates: list[tuple[object, int, int]], taken_a: set[int], taken_b: set[int],
            out: dict[int, int]) -> None:
    for _, a, b in sorted(candidates):  # the lowest cost (nearest in time) first, then the earlier line
        if a not in taken_a and b not in taken_b:
            taken_a.add(a)
            taken_b.add(b)
            out[a] = b


def _within(times: list[float], members: list[int], ts: float, window: float) -> list[int]:
    return members[bisect_left(times, ts - window):bisect_right(times, ts + window)]


def _index(servers: Sequence[int], key, lines: Sequence[HopLine]) -> dict:
    """Server lines by ``key`` (None left out), each bucket in start order with its starts beside it."""
    buckets: dict = defaultdict(list)
    for k in servers:
        v = key(lines[k].entry)
        if v is not None:
            buckets[v].append(k)
    out = {}
    for v, members in buckets.items():
        members.sort(key=lambda k: lines[k].entry.ts)
        out[v] = ([lines[k].entry.ts for k in members], members)
    return out


def _other_request(a: AccessLogEntry, b: AccessLogEntry) -> bool:
    """Whether the two lines name another method or path (%REQ(:METHOD)%, %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%:
    the caller's sidecar sends both on as they came), each where both logged it."""
    return bool(a.method and b.method and a.method != b.method) or bool(a.path and b.path and a.path != b.path)


def _in_order(servers: Sequence[int], lines: Sequence[HopLine]) -> bool:
    """Whether one connection's requests are answered in the order they were sent: HTTP/1.x (RFC 9112 section
    9.3), by the server sidecar's %PROTOCOL% (its downstream, the hop's own); h2's streams are not."""
    return all((lines[s].entry.protocol or "").upper().startswith("HTTP/1") for s in servers)


def _by_four_tuple(lines: Sequence[HopLine], callers: Sequence[int], by_remote: dict) -> list[tuple]:
    """Rule 1's candidates as (cost, caller, server): the same request's method and path first; then, on an
    HTTP/1.x connection both sides logged alike (as many lines each), the k-th caller line with the k-th server
    line (the order of requests on one connection, whatever the two clocks say); then the nearest start."""
    on_conn: dict[str, list[int]] = defaultdict(list)
    for c in callers:
        e = lines[c].entry
        if e.upstream_local is not None and e.upstream_local in by_remote:
            on_conn[e.upstream_local].append(c)
    cands = []
    for conn, cs in on_conn.items():
        times, members = by_remote[conn]
        cs.sort(key=lambda k: lines[k].entry.ts)
        ordered = len(cs) == len(members) and _in_order(members, lines)
        rank = {s: n for n, s in enumerate(members)}
        for n, c in enumerate(cs):
            e = lines[c].entry
            cands += [((_other_request(e, lines[s].entry), abs(rank[s] - n) if ordered else 0,
                        abs(lines[s].entry.ts - e.ts)), c, s)
                      for s in _within(times, members, e.ts, JOIN_WINDOW_S)
                      if s != c and _ids_agree(e, lines[s].entry)]
    return cands


def pair_hops(lines: Sequence[HopLine], callers: Sequence[int], servers: Sequence[int]) -> dict[int, int]:
    """Caller line -> server line, one-to-one, by the module's rules; ``callers`` and ``servers`` index
    ``lines`` (caller sidecars' outbound lines, server sidecars' inbound ones, or a listener's own line of no
    cluster)."""
    paired: dict[int, int] = {}
    used_c: set[int] = set()
    used_s: set[int] = set()
    by_remote = _index(servers, lambda e: e.downstream_remote, lines)
    _greedy(_by_four_tuple(lines, callers, by_remote), used_c, used_s, paired)

    by_local_id = _index(servers, lambda e: (e.downstream_local, e.request_id)
                         if e.downstream_local and e.request_id else None, lines)
    cands = []
    for c in callers:
        e = lines[c].entry
        if c in used_c or not (e.upstream_host and e.request_id):
            continue
        times, members = by_local_id.get((e.upstream_host, e.request_id), ((), ()))
        cands += [((_other_request(e, lines[s].entry), abs(lines[s].entry.ts - e.ts)), c, s)
                  for s in _within(list(times), list(members), e.ts, JOIN_WINDOW_S)
                  if s != c and s not in used_s
                  and not (e.upstream_local and lines[s].entry.downstream_remote)]  # rule 1 applied there
    _greedy(cands, used_c, used_s, paired)

    callers_by_id: dict[str, list[int]] = defaultdict(list)
    servers_by_id: dict[str, list[int]] = defaultdict(list)
    for c in callers:
        if lines[c].entry.request_id:
            callers_by_id[lines[c].entry.request_id].append(c)
    for s in servers:
        if lines[s].entry.request_id:
            servers_by_id[lines[s].entry.request_id].append(s)
    for rid, cs in callers_by_id.items():
        ss = servers_by_id.get(rid, ())
        if len(cs) != 1 or len(ss) != 1 or cs[0] in used_c or ss[0] in used_s or cs[0] == ss[0]:
            continue
        e, s = lines[cs[0]].entry, lines[ss[0]].entry
        if (e.upstream_local and s.downstream_remote) or (e.upstream_host and s.downstream_local):
            continue  # addresses that could have paired them and did not: another hop
        paired[cs[0]] = ss[0]
        used_c.add(cs[0])
        used_s.add(ss[0])
    return paired


def _same_pod(inbound: HopLine, outbound: HopLine) -> bool:
    if inbound.pod is not None and outbound.pod is not None:
        return inbound.pod == outbound.pod
    ip = _ip(inbound.entry.downstream_local)
    return ip is not None and ip == _ip(outbound.entry.upstream_local)


def link_within_pods(lines: Sequence[HopLine], callers: Sequence[int], servers: Sequence[int]) -> dict[int, int]:
    """Inbound line -> the outbound line its pod's app sent on for the same request (the module's rule), each
    line once: the outbound of the inbound's answer code first, then the nearest in time (the request the app
    was serving when it called: a client's fixed id is on other requests too)."""
    by_pod: dict[tuple, list[int]] = defaultdict(list)
    for c in callers:
        o = lines[c]
        if o.entry.request_id:
            if o.pod is not None:
                by_pod[(o.entry.request_id, "pod", o.pod)].append(c)
            if _ip(o.entry.upstream_local):
                by_pod[(o.entry.request_id, "ip", _ip(o.entry.upstream_local))].append(c)
    index = {}
    for key, members in by_pod.items():
        members.sort(key=lambda k: lines[k].entry.ts)
        index[key] = ([lines[k].entry.ts for k in members], members)
    cands = []
    for s in servers:
        e = lines[s].entry
        if not e.request_id:
            continue
        span = e.duration_ms / 2000  # the window's half-width, about its middle
        middle = e.ts + span
        found = []
        for key in ((e.request_id, "pod", lines[s].pod), (e.request_id, "ip", _ip(e.downstream_local))):
            if key[2] is not None and key in index:
                times, members = index[key]
                found += _within(times, members, middle, span + SAME_CLOCK_S)
        for c in dict.fromkeys(found):
            o = lines[c].entry
            if c != s and _same_pod(lines[s], lines[c]):
                cands.append(((o.code != e.code, abs(o.ts - e.ts)), s, c))
    linked: dict[int, int] = {}
    _greedy(cands, set(), set(), linked)
    return linked


def links(lines: Sequence[HopLine], callers: Sequence[int], servers: Sequence[int]) -> HopLinks:
    """The hops (pair_hops) and the links within pods (link_within_pods) of ``lines``."""
    server_of = pair_hops(lines, callers, servers)
    onward = link_within_pods(lines, callers, servers)
    return HopLinks(server_of, {s: c for c, s in server_of.items()}, onward, {o: i for i, o in onward.items()})
