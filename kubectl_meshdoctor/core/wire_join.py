"""One connection's eth0 seen from both its pods, and one retried request's attempts: each one finding
(join_hops runs these after joining a request's hops, core/hops.py)."""

from __future__ import annotations

from dataclasses import replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

from .findings import PACKET, SPEC, Finding, FlowRef
from .hop_pairs import SAME_CLOCK_S, direction, logged_entries, parsed_lines


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
    downstream (%DOWNSTREAM_REMOTE_ADDRESS% the flow's client), on its inbound cluster or on none (a listener's
    own line: ``0 NR filter_chain_not_found`` names no cluster)."""
    return isinstance(f.flow, FlowRef) and any(e.downstream_remote == f.flow.client and direction(e) != "outbound"
                                               for e in logged_entries(f))


def same_connection(findings: list[Finding]) -> list[Finding]:
    """``findings`` with the packet findings of one eth0 connection (same detector, variant and four-tuple)
    made one: the caller's eth0 and the server pod's are the two ends of one veth (a pod's network, CNI), so
    both captures hold the same frames. One is kept and gains the others' lines and names their captures: the
    one quoting the connection's server end's line (the pod that accepted the connection said what it did with
    it: the hop that failed), else the one quoting the most (the caller's 503). Where neither was logged, the
    one of the pod that opened the connection (``details["end"]``, pipeline.py: its own address is the flow's
    client; its kernel sent the SYNs), else the first; unless two of them say they are the same end (copies of
    one pod's capture under two names), when each stands."""
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
        ends = [findings[i].details.get("end") for i in members if findings[i].details.get("end")]
        if not any(findings[i].access_log for i in members) and len(ends) != len(set(ends)):
            continue  # two pods each its same end: not the two ends of one veth, so each reading stands
        best = max(members, key=lambda i: (_logged_by_server_end(findings[i]), len(findings[i].access_log),
                                           findings[i].details.get("end") == "client", -i))
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
                        # what the other pod's API objects said of it (its sidecar's runs) stays with the finding
                        evidence=f.evidence + tuple(e for e in other.evidence if e.kind == SPEC
                                                    and e not in f.evidence),
                        explanation=f"{f.explanation} Pod {other.pod or '?'}'s capture of the same connection "
                                    f"({source}, frames {frames}) holds the same packets: the two ends of one "
                                    f"eth0 link.",
                        details={**f.details, "hops": list(f.details.get("hops", ())) + [
                            {"pod": other.pod, "role": "same connection", "source": source}]})
        out.append(f)
    return out


def _attempt_key(f: Finding) -> tuple | None:
    """What the attempts of one request share, for a packet finding: its pod, detector, variant and server."""
    if not isinstance(f.flow, FlowRef) or not any(e.kind == PACKET for e in f.evidence):
        return None
    return f.pod, f.detector, f.variant, f.flow.server


def _of_attempts(f: Finding, lines: set[str], retried: list[AccessLogEntry]) -> bool:
    """Whether every line ``f`` quotes is one of a retried request's attempts: a line the request's finding
    quotes already (``lines``: the cross-pod join gave it the server's line of its hop), or the server's line of
    the same x-request-id started within the retried line's span (an attempt's own request at the server pod,
    one clock's millisecond either side)."""
    if not f.access_log:
        return False
    spans = [(e.request_id, e.ts - SAME_CLOCK_S, e.ts + e.duration_ms / 1000 + SAME_CLOCK_S) for e in retried
             if e.request_id]
    parsed = dict(parsed_lines(f))

    def in_span(e: AccessLogEntry | None) -> bool:
        return e is not None and any(e.request_id == rid and lo <= e.ts <= hi for rid, lo, hi in spans)

    return all(text in lines or in_span(parsed.get(text)) for text in f.access_log)


def one_request(findings: list[Finding]) -> list[Finding]:
    """``findings`` with the packet findings of one retried request's attempts made one: a line flagged URX (the
    retries spent, Envoy's %RESPONSE_FLAGS%) is one request however many connections its attempts took. Each
    attempt's finding (same pod, detector, variant and server) quotes it, or quotes only lines of its attempts
    (_of_attempts: the server pod's finding of an attempt whose hop the cross-pod join did not give the URX
    line). The first quoting it is kept, with the others' evidence and lines, and in ``details["attempts"]``
    every attempt's connection ({"client", "iface"}), its own first."""
    first: dict[tuple, int] = {}
    keep: dict[int, list[Finding]] = {}
    dropped: set[int] = set()
    retried_of: dict[int, list[AccessLogEntry]] = {}
    for i, f in enumerate(findings):
        key = _attempt_key(f)
        retried = [(line, e) for line, e in zip(f.access_log, logged_entries(f)) if "URX" in e.flags]
        if not retried or key is None:
            continue
        key = (*key, tuple(line for line, _ in retried))
        if key in first:
            keep[first[key]].append(f)
            dropped.add(i)
        else:
            first[key] = i
            keep[i] = []
            retried_of[i] = [e for _, e in retried]
    for i, f in enumerate(findings):
        key = _attempt_key(f)
        if i in keep or i in dropped or key is None:
            continue
        for k, retried in retried_of.items():
            lines = {t for g in (findings[k], *keep[k]) for t in g.access_log}
            if _attempt_key(findings[k]) == key and _of_attempts(f, lines, retried):
                keep[k].append(f)
                dropped.add(i)
                break
    out = []
    for i, f in enumerate(findings):
        if i in dropped:
            continue
        others = keep.get(i, ())
        if others:
            attempts = list({a["client"]: a for a in [
                *(f.details.get("attempts") or [{"client": f.flow.client, "iface": f.flow.iface}]),
                *(a for o in others for a in (o.details.get("attempts")
                                               or [{"client": o.flow.client, "iface": o.flow.iface}]))]}.values())
            f = replace(f.with_lines(x for o in others for x in o.quoted_lines()),
                        evidence=f.evidence + tuple(e for o in others for e in o.evidence if e not in f.evidence),
                        explanation=f"{f.explanation} The request was tried {len(attempts)} times, each on a "
                                    f"connection of its own (from {', '.join(a['client'] for a in attempts)}), "
                                    f"each failing alike: Envoy logged it once, flagged URX (its retries spent).",
                        details={**f.details, "attempts": attempts})
        out.append(f)
    return out
