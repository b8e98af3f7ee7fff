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

from dataclasses import replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry, parse_line
from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster

from .findings import PACKET, Finding, FlowRef

JOIN_WINDOW_S = 5.0  # a caller's line and the server's of one connection: the request's start, both clocks
RELAYED = "via_upstream"


def _entries(f: Finding) -> list[AccessLogEntry]:
    return [e for e in map(parse_line, f.access_log) if e is not None]


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


def join_hops(findings: list[Finding]) -> list[Finding]:
    """``findings`` with each request's two hops made one finding:
    - a caller's finding of a relayed answer (via_upstream) is folded into the server-side finding of the same
      request: the server pod's sidecar failed, the caller passed its answer on;
    - a server-side finding of its downstream going away (DC) is folded into the caller's finding of the same
      request: the caller's sidecar gave up (its route timeout: 504 UT) or its client did (DC there too).
    The finding kept gains the other's access-log lines and evidence and, in ``details["hops"]``, the other
    pod and what it logged; the other is dropped. Findings of no such pair are kept as they are, in order.
    Then one connection's eth0 seen from both its pods is one finding (same_connection)."""
    return same_connection(_join_requests(findings))


def _wire_key(f: Finding) -> tuple | None:
    flow = f.flow
    if not isinstance(flow, FlowRef) or flow.iface != "eth0" or not any(e.kind == PACKET for e in f.evidence):
        return None
    return (f.detector, f.variant, flow.client, flow.server)


def same_connection(findings: list[Finding]) -> list[Finding]:
    """``findings`` with the packet findings of one eth0 connection (same detector, variant and four-tuple)
    made one: the caller's eth0 and the server pod's are the two ends of one veth (a pod's network, CNI), so
    both captures hold the same frames. When one of them quotes access-log lines (the caller's 503) and the others
    none, it is kept and names the other pod's capture, and the rest are dropped; otherwise each pod keeps its
    own."""
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(findings):
        key = _wire_key(f)
        if key is not None:
            groups.setdefault(key, []).append(i)
    keep: dict[int, list[Finding]] = {}
    dropped: set[int] = set()
    for members in groups.values():
        pods = {findings[i].pod for i in members}
        if len(members) < 2 or len(pods) < 2:
            continue
        best = max(members, key=lambda i: (len(findings[i].access_log), -i))
        others = [i for i in members if i != best]
        # Only a view that adds nothing: the kept one quotes a logged request, the others none. Each pod's own
        # reading of the frames stands where neither was logged (a collision seen from both ends, each pod's).
        if not findings[best].access_log or any(findings[i].access_log for i in others):
            continue
        keep[best] = [findings[i] for i in others]
        dropped.update(others)
    out = []
    for i, f in enumerate(findings):
        if i in dropped:
            continue
        for other in keep.get(i, ()):
            frames = ", ".join(str(e.frame) for e in other.evidence if e.kind == PACKET)
            source = next((e.source for e in other.evidence if e.kind == PACKET), "")
            f = replace(f, access_log=f.access_log + tuple(x for x in other.access_log if x not in f.access_log),
                        explanation=f"{f.explanation} Pod {other.pod or '?'}'s capture of the same connection "
                                    f"({source}, frames {frames}) holds the same packets: the two ends of one "
                                    f"eth0 link.",
                        details={**f.details, "hops": list(f.details.get("hops", ())) + [
                            {"pod": other.pod, "role": "same connection", "source": source}]})
        out.append(f)
    return out


def _join_requests(findings: list[Finding]) -> list[Finding]:
    parsed = [_entries(f) for f in findings]  # each finding's lines read once: parse_line tries every format
    inbound = [(i, [e for e in es if _direction(e) == "inbound"]) for i, es in enumerate(parsed)]
    outbound = [(i, [e for e in es if _caller_side(e)]) for i, es in enumerate(parsed)]
    folded: dict[int, list[tuple[Finding, list[AccessLogEntry], str]]] = {}
    dropped: set[int] = set()
    for j, (f, entries) in enumerate(zip(findings, parsed)):
        for own, others, role in ((relayed_only(f, entries), inbound, "caller"),
                                  (server_disconnect_only(f, entries), outbound, "server")):
            if not own:
                continue
            target = next((i for i, theirs in others if i != j and i not in dropped
                           and any(_same_request(*((a, b) if role == "caller" else (b, a)))
                                   for a in own for b in theirs)), None)
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
    return replace(f, access_log=f.access_log + tuple(x for x in other.access_log if x not in f.access_log),
                   evidence=f.evidence + tuple(x for x in other.evidence if x not in f.evidence),
                   # several requests of one finding, each relayed alike: the sentence once
                   explanation=f.explanation if told in f.explanation else f.explanation + told,
                   details={**f.details, "hops": hops})
