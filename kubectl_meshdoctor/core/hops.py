"""One request across two hops of a mesh: the caller's sidecar (its outbound cluster) and the server pod's sidecar
(its inbound cluster) each log it, under other flags.

A server sidecar's ``503 UF`` reaches the caller as ``503 - via_upstream`` (``URX`` where 503s are retried), its
``502 UPE`` as ``502 - via_upstream``: the caller's line is the user's 503, the server's tells why. When both pods'
logs were read, the caller's finding of a relayed answer is folded into the server-side finding of the same
request, so each failing request is one finding that quotes both lines.

Two lines are one request when they carry the same x-request-id (%REQ(X-REQUEST-ID)%: the caller's sidecar
generates it and the server's keeps it, Envoy's http_conn_man/headers.rst), else when the caller's
%UPSTREAM_LOCAL_ADDRESS% is the server's %DOWNSTREAM_REMOTE_ADDRESS% (the four-tuple of the hop's connection)
and their times lie within JOIN_WINDOW_S.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry, parse_line
from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster

from .findings import PACKET, Evidence, Finding, FlowRef

JOIN_WINDOW_S = 5.0  # a caller's line and the server's of one connection: the request's start, both clocks
RELAYED = "via_upstream"


@dataclass(frozen=True, slots=True)
class LoggedLine:
    """A 5xx answer a pod's sidecar logged that none of its findings quotes (the app's own 500, passed on): the
    pod, the line as quoted, parsed, and where it was read. join_hops gives it to the other hop's finding of the
    same request."""

    pod: str | None
    text: str
    entry: AccessLogEntry
    evidence: Evidence


def logged_entries(f: Finding) -> list[AccessLogEntry]:
    """``f``'s access-log lines as the pipeline parsed them (any format it read, --log-format's too); a line that
    came without its parse (a detector's own quote) read in the known formats, and left out when none fits."""
    out = []
    for text, entry in f.quoted_lines():
        if entry is None:
            entry = parse_line(text)
        if entry is not None:
            out.append(entry)
    return out


_entries = logged_entries


def _direction(entry: AccessLogEntry) -> str | None:
    cluster = parse_istio_cluster(entry.upstream_cluster)
    return cluster.direction if cluster is not None else None


def _same_request(caller: AccessLogEntry, server: AccessLogEntry) -> bool:
    if caller.request_id and server.request_id:
        return caller.request_id == server.request_id
    return (caller.upstream_local is not None and caller.upstream_local == server.downstream_remote
            and abs(caller.ts - server.ts) <= JOIN_WINDOW_S)


def relayed_only(f: Finding, entries: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """``entries`` (``f``'s access-log lines, parsed) when every one of its lines is a caller's sidecar passing on
    what the next hop answered (details via_upstream on an outbound cluster); [] otherwise: a failure of the
    caller's own, or a line not read."""
    if not entries or len(entries) != len(f.access_log):
        return []
    if all(e.details == RELAYED and _direction(e) == "outbound" for e in entries):
        return entries
    return []


def server_disconnect_only(f: Finding, entries: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """``entries`` (``f``'s access-log lines, parsed) when every one is the server pod's sidecar seeing its
    downstream go away (DC on its inbound cluster): the caller's doing, told by the caller's own line; []
    otherwise."""
    if not entries or len(entries) != len(f.access_log):
        return []
    if all("DC" in e.flags and _direction(e) == "inbound" for e in entries):
        return entries
    return []


def _caller_side(entry: AccessLogEntry) -> bool:
    """A caller's sidecar's line: its upstream is another pod (an outbound cluster, or a passthrough one)."""
    return _direction(entry) != "inbound" and entry.upstream_cluster is not None


def join_hops(findings: list[Finding], logged: Sequence[LoggedLine] = ()) -> list[Finding]:
    """``findings`` with each request's two hops made one finding:
    - a caller's finding of a relayed answer (via_upstream) is folded into the server-side finding of the same
      request: the server pod's sidecar failed, the caller passed its answer on;
    - a server-side finding of its downstream going away (DC) is folded into the caller's finding of the same
      request: the caller's sidecar gave up (its route timeout: 504 UT) or its client did (DC there too).
    The finding kept gains the other's access-log lines and evidence and, in ``details["hops"]``, the other
    pod and what it logged; the other is dropped. Findings of no such pair are kept as they are, in order.
    A finding quoting a caller's relayed 5xx gains the server pod's line of the same request from ``logged`` (the
    app's answer, logged at both hops: with_next_hop_lines).
    Then one connection's eth0 seen from both its pods is one finding (same_connection), and so are the
    attempts of one retried request (one_request)."""
    return one_request(same_connection(with_next_hop_lines(_join_requests(findings), logged)))


def with_next_hop_lines(findings: list[Finding], logged: Sequence[LoggedLine]) -> list[Finding]:
    """Each finding that quotes a caller's relayed 5xx (via_upstream on an outbound cluster) with the line another
    pod's sidecar logged for the same request on its inbound cluster (x-request-id, else the hop's four-tuple),
    each such line given once: the request's two hops quoted together."""
    pool = [x for x in logged if _direction(x.entry) == "inbound"]
    if not pool:
        return findings
    used: set[int] = set()
    index = _Lines([(k, [x.entry]) for k, x in enumerate(pool)], caller_side=False)
    out = []
    for f in findings:
        relayed = [e for e in _entries(f) if e.details == RELAYED and e.code >= 500 and _direction(e) == "outbound"]
        near = sorted({k for e in relayed for k in index.candidates(e, caller_side=False)})
        found = [(k, pool[k]) for k in near if k not in used and pool[k].pod != f.pod
                 and any(_same_request(e, pool[k].entry) for e in relayed)]
        if found:
            used.update(k for k, _ in found)
            f = replace(f.with_lines((x.text, x.entry) for _, x in found),
                        evidence=f.evidence + tuple(x.evidence for _, x in found),
                        details={**f.details, "hops": list(f.details.get("hops", ())) + [
                            {"pod": x.pod, "role": "server", "logged": f"{x.entry.code} "
                             f"{','.join(x.entry.flags) or '-'} {x.entry.details}",
                             "cluster": x.entry.upstream_cluster, "request_id": x.entry.request_id}
                            for _, x in found]})
        out.append(f)
    return out


def _wire_keys(f: Finding) -> list[tuple]:
    """The eth0 connections a packet finding is of, as (detector, variant, client, server): its flow's, and those
    of the other attempts of its request (one_request)."""
    flow = f.flow
    if not isinstance(flow, FlowRef) or flow.iface != "eth0" or not any(e.kind == PACKET for e in f.evidence):
        return []
    clients = [flow.client, *(a["client"] for a in f.details.get("attempts", ()))]
    return [(f.detector, f.variant, c, flow.server) for c in dict.fromkeys(clients)]


def _logged_by_server_end(f: Finding) -> bool:
    """Whether ``f`` quotes the line of its connection's server end: the pod that accepted it logged it as its
    downstream (%DOWNSTREAM_REMOTE_ADDRESS% the flow's client)."""
    return isinstance(f.flow, FlowRef) and any(e.downstream_remote == f.flow.client and _direction(e) == "inbound"
                                               for e in _entries(f))


def same_connection(findings: list[Finding]) -> list[Finding]:
    """``findings`` with the packet findings of one eth0 connection (same detector, variant and four-tuple)
    made one: the caller's eth0 and the server pod's are the two ends of one veth (a pod's network, CNI), so
    both captures hold the same frames. When one of them quotes access-log lines, one is kept and gains the
    others' lines and names their captures: the one quoting the connection's server end's line (the pod that
    accepted the connection said what it did with it: the hop that failed), else the one quoting the most (the
    caller's 503). Where neither was logged each pod keeps its own reading (a collision seen from both ends)."""
    groups: dict[tuple, list[int]] = {}
    member_of: dict[int, tuple] = {}
    for i, f in enumerate(findings):
        for key in _wire_keys(f):
            if i not in member_of and key in groups:  # a finding of several attempts joins the first group it meets
                groups[key].append(i)
                member_of[i] = key
            elif i not in member_of:
                groups[key] = [i]
                member_of[i] = key
            elif key not in groups:
                groups[key] = groups[member_of[i]]
    keep: dict[int, list[Finding]] = {}
    dropped: set[int] = set()
    for members in {id(m): m for m in groups.values()}.values():
        pods = {findings[i].pod for i in members}
        if len(members) < 2 or len(pods) < 2:
            continue
        best = max(members, key=lambda i: (_logged_by_server_end(findings[i]), len(findings[i].access_log), -i))
        if not findings[best].access_log:
            continue  # each pod's own reading of the frames stands where neither was logged
        keep[best] = [findings[i] for i in members if i != best]
        dropped.update(i for i in members if i != best)
    out = []
    for i, f in enumerate(findings):
        if i in dropped:
            continue
        for other in keep.get(i, ()):
            frames = ", ".join(str(e.frame) for e in other.evidence if e.kind == PACKET)
            source = next((e.source for e in other.evidence if e.kind == PACKET), "")
            f = replace(f.with_lines(other.quoted_lines()),
                        envoy_log=f.envoy_log + tuple(x for x in other.envoy_log if x not in f.envoy_log),
                        explanation=f"{f.explanation} Pod {other.pod or '?'}'s capture of the same connection "
                                    f"({source}, frames {frames}) holds the same packets: the two ends of one "
                                    f"eth0 link.",
                        details={**f.details, "hops": list(f.details.get("hops", ())) + [
                            {"pod": other.pod, "role": "same connection", "source": source}]})
        out.append(f)
    return out


def one_request(findings: list[Finding]) -> list[Finding]:
    """``findings`` with the packet findings of one retried request's attempts made one: a line flagged URX (the
    retries spent, Envoy's %RESPONSE_FLAGS%) is one request however many connections its attempts took, and
    each attempt's finding (same pod, detector, variant and server) quotes it. The first is kept, with the
    others' evidence and, in ``details["attempts"]``, each other attempt's connection."""
    first: dict[tuple, int] = {}
    keep: dict[int, list[Finding]] = {}
    dropped: set[int] = set()
    for i, f in enumerate(findings):
        retried = [line for line, e in zip(f.access_log, _entries(f)) if "URX" in e.flags]
        if not retried or not isinstance(f.flow, FlowRef) or not any(e.kind == PACKET for e in f.evidence):
            continue
        key = (f.pod, f.detector, f.variant, f.flow.server, tuple(retried))
        if key in first:
            keep[first[key]].append(f)
            dropped.add(i)
        else:
            first[key] = i
            keep[i] = []
    out = []
    for i, f in enumerate(findings):
        if i in dropped:
            continue
        others = keep.get(i, ())
        if others:
            attempts = [{"client": o.flow.client, "iface": o.flow.iface} for o in others]
            f = replace(f.with_lines(x for o in others for x in o.quoted_lines()),
                        evidence=f.evidence + tuple(e for o in others for e in o.evidence if e not in f.evidence),
                        explanation=f"{f.explanation} The request was tried {len(others) + 1} times, each on a "
                                    f"connection of its own (from "
                                    f"{', '.join([f.flow.client, *(a['client'] for a in attempts)])}), each "
                                    f"failing alike: Envoy logged it once, flagged URX (its retries spent).",
                        details={**f.details, "attempts": list(f.details.get("attempts", ())) + attempts})
        out.append(f)
    return out


class _Lines:
    """Each finding's lines of one side (a server's inbound ones, or a caller's), indexed by what _same_request
    can match them on, so a request's other hop is looked up, not searched for among every finding (the live view
    joins on a timer: core/live_join.py)."""

    def __init__(self, lines: list[tuple[int, list[AccessLogEntry]]], caller_side: bool) -> None:
        self.lines = dict(lines)
        self.by_key: dict[tuple[str, str], set[int]] = {}
        for i, entries in lines:
            for e in entries:
                if e.request_id:
                    self.by_key.setdefault(("id", e.request_id), set()).add(i)
                address = e.upstream_local if caller_side else e.downstream_remote
                if address is not None:  # a kept-alive connection's requests share it: those with no id apart
                    self.by_key.setdefault(("addr", address), set()).add(i)
                    if not e.request_id:
                        self.by_key.setdefault(("addr-no-id", address), set()).add(i)

    def candidates(self, e: AccessLogEntry, caller_side: bool) -> set[int]:
        """The findings whose lines may be of ``e``'s request (``e`` of the other side; ``caller_side`` as the
        index was made with): the same x-request-id, or, where one of the two has none, the hop's four-tuple."""
        address = e.downstream_remote if caller_side else e.upstream_local
        if not e.request_id:
            return self.by_key.get(("addr", address), set()) if address is not None else set()
        found = self.by_key.get(("id", e.request_id), set())
        return found | self.by_key.get(("addr-no-id", address), set()) if address is not None else found


def _join_requests(findings: list[Finding]) -> list[Finding]:
    parsed = [_entries(f) for f in findings]  # each finding's lines read once: parse_line tries every format
    inbound = _Lines([(i, [e for e in es if _direction(e) == "inbound"]) for i, es in enumerate(parsed)], False)
    outbound = _Lines([(i, [e for e in es if _caller_side(e)]) for i, es in enumerate(parsed)], True)
    folded: dict[int, list[tuple[Finding, list[AccessLogEntry], str]]] = {}
    dropped: set[int] = set()
    for j, (f, entries) in enumerate(zip(findings, parsed)):
        for own, others, role in ((relayed_only(f, entries), inbound, "caller"),
                                  (server_disconnect_only(f, entries), outbound, "server")):
            if not own:
                continue
            # the first finding in order with a line of the same request (_same_request decides, the index only
            # narrows the look)
            near = sorted({i for a in own for i in others.candidates(a, role == "server")})
            target = next((i for i in near if i != j and i not in dropped
                           and any(_same_request(*((a, b) if role == "caller" else (b, a)))
                                   for a in own for b in others.lines[i])), None)
            if target is not None:
                folded.setdefault(target, []).append((f, own, role))
                dropped.add(j)
                break
    out = []
    for i, f in enumerate(findings):
        if i in dropped:
            continue
        for other, entries, role in folded.get(i, ()):
            f = _fold(f, other, entries, role)
        out.append(f)
    return out


def _fold(f: Finding, other: Finding, entries: list[AccessLogEntry], role: str) -> Finding:
    added = [{"pod": other.pod, "role": role, "logged": f"{e.code} {','.join(e.flags) or '-'} {e.details}",
              "cluster": e.upstream_cluster, "request_id": e.request_id} for e in entries]
    hops = list(f.details.get("hops", ())) + added
    said = "; ".join(dict.fromkeys(h["logged"] for h in added))
    if role == "caller":
        who = f"pod {other.pod}'s sidecar" if other.pod else "the caller's sidecar"
        told = (f" The caller saw it through {who}, which logged the same request as {said}: this hop's "
                f"answer, passed on.")
    else:
        who = f"pod {other.pod}'s sidecar" if other.pod else "the server pod's sidecar"
        told = (f" The next hop, {who}, logged the same request as {said}: it saw this side go away, "
                f"the effect of this finding, not a failure of its own.")
    return replace(f.with_lines(other.quoted_lines()),
                   evidence=f.evidence + tuple(x for x in other.evidence if x not in f.evidence),
                   # several requests of one finding, each relayed alike: the sentence once
                   explanation=f.explanation if told in f.explanation else f.explanation + told,
                   details={**f.details, "hops": hops})
