"""One connection's eth0 seen from both its pods, and one retried request's attempts: each one finding
(join_hops runs these after joining a request's hops, core/hops.py)."""

from __future__ import annotations

from dataclasses import replace

from .findings import PACKET, Finding, FlowRef
from .hop_pairs import direction, logged_entries


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
        retried = [line for line, e in zip(f.access_log, logged_entries(f)) if "URX" in e.flags]
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
