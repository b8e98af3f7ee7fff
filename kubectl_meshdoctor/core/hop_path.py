"""Where on a request's path a finding is. In an Istio mesh a request crosses three legs, each between two
parties, and each sidecar has a downstream side (who calls it) and an upstream side (whom it calls):

    client -> caller sidecar -> (mTLS over eth0) -> server sidecar -> app
      the caller pod's lo                             the server pod's lo

A finding is on one leg: a capture's interface and the pod's place tell which (lo in the server pod is the
server sidecar's upstream, 127.0.0.6 to the app; lo in the caller pod is the client's connection REDIRECTed to
the caller's 15001; eth0 is the leg between the pods). A finding made of Envoy's lines is on the leg its
response flags name: a server sidecar's UF, UC, UPE, UT are its upstream (the app), its DC, DPE and
filter_chain_not_found its downstream; a caller's DC, DPE, NR its downstream (the client), its UO, UH, UF, UC,
UT and a relayed answer (via_upstream) its upstream. Sources: Envoy's access-log response flags
(docs/root/configuration/observability/access_log/usage.rst), Istio's cluster names (outbound|PORT||HOST,
inbound|PORT||) and its sidecar's 127.0.0.6 (pilot/pkg/networking/core, InboundPassthroughBindIpv4).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry, parse_line
from kubectl_meshdoctor.envoy.istio_cluster import parse_istio_cluster

from .findings import COUNTER, Finding, FlowRef, NoFlow

CLIENT_TO_CALLER = "client -> caller sidecar"
CALLER_TO_SERVER = "caller sidecar -> server sidecar"
SERVER_TO_APP = "server sidecar -> app"
INBOUND_BIND = "127.0.0.6"  # the server sidecar's source address towards the app (Istio >= 1.10)
OUTBOUND_CAPTURE_PORT = 15001  # where istio-iptables REDIRECTs the caller's app's outbound connections
SIDECAR_DOWNSTREAM = "client -> sidecar"  # a sidecar's downstream leg, the pod's place on the path unknown
# Flags and %RESPONSE_CODE_DETAILS% a sidecar sets of its downstream (the party that called it): its own reply to
# a request it would not route or parse, or a caller that went away. The rest are of its upstream.
DOWNSTREAM_FLAGS = frozenset({"DC", "DPE", "NR", "DT", "DI", "DO", "RL"})
DOWNSTREAM_DETAILS = ("downstream_", "upgrade_failed", "route_not_found", "filter_chain_not_found", "low_version",
                      "codec_error")
RELAYED = "via_upstream"


@dataclass(frozen=True, slots=True)
class Hop:
    """A finding's leg of the path (CLIENT_TO_CALLER, CALLER_TO_SERVER, SERVER_TO_APP; SIDECAR_DOWNSTREAM when
    only the side of the pod's sidecar is known), the pod whose
    files show it, that pod's place on the path (``caller`` or ``server``, "" when not known) and ``mtls``: the
    leg between the pods was seen speaking Istio mTLS (a TLS record in the evidence)."""

    leg: str
    pod: str | None
    role: str = ""
    mtls: bool = False
    also: tuple[str, ...] = ()  # the other pods whose files show it: the same request logged, or connection captured

    def text(self) -> str:
        """``caller sidecar -> server sidecar (mTLS), seen from pod/caller; also seen from pod/server``; the leg
        between the pods with no TLS record seen is ``caller -> server sidecar (eth0)``."""
        leg = self.leg
        if leg == CALLER_TO_SERVER:  # no TLS record seen: the caller may be a sidecar or a client outside the mesh
            leg = f"{leg} (mTLS)" if self.mtls else "caller -> server sidecar (eth0)"
        seen = f"{leg}, seen from pod/{self.pod}" if self.pod else leg
        return seen + (f"; also seen from {', '.join(f'pod/{p}' for p in self.also)}" if self.also else "")


def own_addresses(on_lo: Iterable[str]) -> frozenset[str]:
    """The pod's own addresses among those of the SYNs its ``lo`` capture holds (IP strings): every one but
    loopback's. A connection over lo is between two of the host's own addresses (Linux routes a local
    destination through lo), and its SYN is captured after iptables' nat OUTPUT (REDIRECT) rewrote its
    destination; so the pod IP is there whenever its sidecar's REDIRECTed or 127.0.0.6 connections were
    captured opening. (A reply on lo shows the original destination of a REDIRECT: another pod's address.)"""
    out = set()
    for a in on_lo:
        try:
            if not ipaddress.ip_address(a).is_loopback:
                out.add(a)
        except ValueError:
            continue
    return frozenset(out)


def with_end(f: Finding, own: frozenset[str]) -> Finding:
    """``f`` with ``details["end"]``, the pod's end of its eth0 connection, when its own addresses tell it:
    ``client`` (the pod opened it: its sidecar's upstream leg) or ``server`` (the pod accepted it)."""
    flow = f.flow
    if not own or not isinstance(flow, FlowRef) or flow.iface != "eth0" or "end" in f.details:
        return f
    client, server = flow.client.rsplit(":", 1)[0].strip("[]"), flow.server.rsplit(":", 1)[0].strip("[]")
    end = "client" if client in own and server not in own else "server" if server in own and client not in own \
        else None
    return replace(f, details={**f.details, "end": end}) if end else f


def _own_entries(f: Finding) -> list[AccessLogEntry]:
    """The finding's access-log lines logged by its own pod: a joined finding quotes the other pods' too, in the
    request's path order, and names each in details["hops"] (core/hops.py) by what it logged, its cluster and
    its x-request-id; the other end of the same eth0 connection's line comes last (core/wire_join.py)."""
    hops = f.details.get("hops")
    ends = sum(1 for h in hops if isinstance(h, dict) and "logged" not in h) if isinstance(hops, list) else 0
    others = Counter((h.get("logged"), h.get("cluster"), h.get("request_id")) for h in hops
                     if isinstance(h, dict) and "logged" in h) if isinstance(hops, list) else Counter()
    out = []
    for e in (e for e in map(parse_line, f.access_log[:len(f.access_log) - ends]) if e is not None):
        key = (f"{e.code} {','.join(e.flags) or '-'} {e.details}", e.upstream_cluster, e.request_id)
        if others[key] > 0:
            others[key] -= 1
        else:
            out.append(e)
    return out


def _relayed_from_app(f: Finding, entries: list[AccessLogEntry]) -> bool:
    """Whether ``f``'s own lines all pass on the next hop's answer and the server pod's sidecar, joined, logged
    that answer as its app's (via_upstream on its inbound cluster): the request failed in the app."""
    hops = f.details.get("hops")
    return (bool(entries) and all(e.details == RELAYED and _outbound(e) for e in entries) and isinstance(hops, list)
            and any(isinstance(h, dict) and h.get("role") == "server" and str(h.get("logged", "")).endswith(
                f" {RELAYED}") and str(h.get("cluster", "")).startswith("inbound|") for h in hops))


def _outbound(e: AccessLogEntry) -> bool:
    cluster = parse_istio_cluster(e.upstream_cluster)
    return cluster is not None and cluster.direction == "outbound"


def _role(f: Finding, entries: list[AccessLogEntry]) -> str:
    for e in entries:
        cluster = parse_istio_cluster(e.upstream_cluster)
        if cluster is not None:
            return "server" if cluster.direction == "inbound" else "caller"
    flow = f.flow
    if isinstance(flow, FlowRef) and flow.iface == "eth0" and f.details.get("end") in ("client", "server"):
        return "caller" if f.details["end"] == "client" else "server"
    if isinstance(flow, FlowRef) and flow.iface == "lo":
        if flow.client.rsplit(":", 1)[0] == INBOUND_BIND:
            return "server"
        if flow.server.endswith(f":{OUTBOUND_CAPTURE_PORT}"):
            return "caller"
    if isinstance(flow, NoFlow) and flow.kind == COUNTER:
        cluster = parse_istio_cluster(flow.server)
        if cluster is not None:
            return "server" if cluster.direction == "inbound" else "caller"
    return ""


def _leg_of_lines(role: str, entries: list[AccessLogEntry]) -> str | None:
    if not entries:
        return None
    details = {e.details or "" for e in entries}
    downstream = (bool({flag for e in entries for flag in e.flags} & DOWNSTREAM_FLAGS) and RELAYED not in details
                  or any(any(mark in d for mark in DOWNSTREAM_DETAILS) for d in details))
    if role == "server":
        return CALLER_TO_SERVER if downstream else SERVER_TO_APP
    if role == "caller":
        return CLIENT_TO_CALLER if downstream else CALLER_TO_SERVER
    if any("route_not_found" in d for d in details):
        return CLIENT_TO_CALLER  # Istio's inbound routes match every host: a missing route is a caller's (or gateway's)
    return SIDECAR_DOWNSTREAM if downstream else None


def hop_of(f: Finding) -> Hop | None:
    """The leg ``f`` is on, or None when what it rests on does not say (a pod's spec, a plaintext capture with
    no sidecar address on lo and no Envoy line)."""
    entries = _own_entries(f)
    role = _role(f, entries)
    hops = f.details.get("hops")
    also = tuple(dict.fromkeys(str(h["pod"]) for h in hops if isinstance(h, dict) and h.get("pod")
                               and h.get("pod") != f.pod)) if isinstance(hops, list) else ()
    mtls = any(e.record for e in f.evidence) or bool(f.details.get("tls"))
    flow = f.flow
    if isinstance(flow, FlowRef) and flow.iface == "eth0":
        return Hop(CALLER_TO_SERVER, f.pod, role, mtls, also)
    if isinstance(flow, FlowRef) and flow.iface == "lo":
        leg = {"server": SERVER_TO_APP, "caller": CLIENT_TO_CALLER}.get(role)
        return Hop(leg, f.pod, role, also=also) if leg else None
    leg = SERVER_TO_APP if _relayed_from_app(f, entries) else _leg_of_lines(role, entries)
    if leg is None and isinstance(flow, NoFlow) and flow.kind == COUNTER and role:
        leg = SERVER_TO_APP if role == "server" else CALLER_TO_SERVER
    return Hop(leg, f.pod, role, mtls and leg == CALLER_TO_SERVER, also) if leg else None


@dataclass(frozen=True, slots=True)
class FlagsLogger:
    """Whose sidecar writes the access-log lines that carry a finding's response ``flags``: the finding's own pod's
    (``caller_ip`` empty), or the one that opened the finding's eth0 connection, a caller at ``caller_ip``.

    Envoy sets an upstream flag (UC, UF, URX, UPE, ...) on the line of the sidecar whose upstream failed: for a
    connection this pod accepted on eth0 that is the downstream caller's sidecar, and this pod's log has none
    of it (Envoy's access-log response flags, docs/root/configuration/observability/access_log/usage.rst)."""

    flags: tuple[str, ...]
    caller_ip: str = ""

    def text(self) -> str:
        """``UC, UF, URX are logged by the caller's sidecar at 198.18.1.1 (it opened this connection; ...), not by
        this pod's``, or ``UF is logged by this pod's sidecar``."""
        flags = ", ".join(self.flags)
        verb = "is" if len(self.flags) == 1 else "are"
        if not self.caller_ip:
            return f"{flags} {verb} logged by this pod's sidecar"
        return f"{flags} {verb} logged by the caller's sidecar at {self.caller_ip} (it opened this connection; a " \
               f"caller without a sidecar logs none), not by this pod's"


def flags_logger(f: Finding) -> FlagsLogger | None:
    """Whose access log carries ``f``'s response flags (``FlagsLogger``); None for a finding of no flag. On eth0 the
    connection's client logs an upstream flag unless the pod is that client (``details["end"]`` "client"); a
    downstream flag (DC, DPE, NR) is the accepting sidecar's own."""
    if not f.envoy_flags:
        return None
    flow = f.flow
    upstream = any(flag not in DOWNSTREAM_FLAGS for flag in f.envoy_flags)
    if isinstance(flow, FlowRef) and flow.iface == "eth0" and upstream and f.details.get("end") != "client" \
            and flow.client != "-":
        return FlagsLogger(f.envoy_flags, flow.client.rsplit(":", 1)[0].strip("[]"))
    return FlagsLogger(f.envoy_flags)


def quotes_flags(f: Finding) -> bool:
    """Whether an access-log line ``f`` quotes carries one of its response flags."""
    wanted = set(f.envoy_flags)
    return any(e is not None and wanted & set(e.flags) for e in map(parse_line, f.access_log))
