"""One request across two hops of a mesh: the caller's sidecar (its outbound cluster) and the server pod's sidecar
(its inbound cluster) each log it, under other flags.

A server sidecar's ``503 UF`` reaches the caller as ``503 - via_upstream`` (``URX`` once retries are spent), its
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

from .findings import Finding

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


def relayed_only(f: Finding) -> list[AccessLogEntry]:
    """The caller-side lines of ``f`` when every one of its lines is a caller's sidecar passing on what the next
    hop answered (details via_upstream on an outbound cluster); [] otherwise: a failure of the caller's own."""
    entries = _entries(f)
    if not entries or len(entries) != len(f.access_log):
        return []
    if all(e.details == RELAYED and _direction(e) == "outbound" for e in entries):
        return entries
    return []


def join_hops(findings: list[Finding]) -> list[Finding]:
    """``findings`` with each caller's finding of a relayed answer folded into the server-side finding of the
    same request: the server's finding gains the caller's access-log lines and, in ``details["hops"]``, the
    caller's pod and what it logged; the caller's finding is dropped. Findings of no such pair are kept as
    they are, in order."""
    inbound = [(i, [e for e in _entries(f) if _direction(e) == "inbound"]) for i, f in enumerate(findings)]
    inbound = [(i, es) for i, es in inbound if es]
    if not inbound:
        return findings
    folded: dict[int, list[tuple[Finding, list[AccessLogEntry]]]] = {}
    dropped: set[int] = set()
    for j, f in enumerate(findings):
        callers = relayed_only(f)
        if not callers:
            continue
        target = next((i for i, servers in inbound if i != j
                       and any(_same_request(c, s) for c in callers for s in servers)), None)
        if target is not None:
            folded.setdefault(target, []).append((f, callers))
            dropped.add(j)
    out = []
    for i, f in enumerate(findings):
        if i in dropped:
            continue
        for caller, entries in folded.get(i, ()):
            hops = list(f.details.get("hops", ())) + [{
                "pod": caller.pod, "logged": f"{e.code} {','.join(e.flags) or '-'} {e.details}",
                "cluster": e.upstream_cluster, "request_id": e.request_id} for e in entries]
            said = "; ".join(dict.fromkeys(h["logged"] for h in hops))
            who = f"pod {caller.pod}'s sidecar" if caller.pod else "the caller's sidecar"
            f = replace(f, access_log=f.access_log + tuple(x for x in caller.access_log if x not in f.access_log),
                        evidence=f.evidence + tuple(x for x in caller.evidence if x not in f.evidence),
                        explanation=(f"{f.explanation} The caller saw it through {who}, which logged the same "
                                     f"request as {said}: the answer this hop gave, passed on."),
                        details={**f.details, "hops": hops})
        out.append(f)
    return out
