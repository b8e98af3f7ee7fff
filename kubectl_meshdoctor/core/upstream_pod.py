"""A caller's 503 UC whose cause only the upstream pod shows, in a run of several pods that may hold that pod too.

A caller's sidecar logs ``503 UC`` (upstream_reset_before_response_started{connection_termination}) on an outbound
cluster when the connection to the next pod went away under the request. Its own access log cannot tell why (the
keep-alive race, an app that aborted, a conntrack-INVALID segment reset by the upstream pod's kernel): that pod's
captures can. One pod's pipeline cannot know whether the run holds the upstream pod, so its finding asks to capture
it (``unknown_upstream``). A run over several pods (analyze over several pods' files, watch of several pods) knows
its pods: ``point_to_upstream`` finds the pod whose address is the line's %UPSTREAM_HOST% (Envoy's access-log
usage: the upstream host's IP:port; for a pod behind Istio's sidecar, the pod's IP and the service's target port)
and says instead what of it the run holds over the request: that pod's own finding on the same connection (its eth0
four-tuple is the line's %UPSTREAM_LOCAL_ADDRESS% to %UPSTREAM_HOST%) or of the same request (its sidecar's line,
paired as core/hop_pairs.py pairs a hop), else its captures to look in, else what of it to capture. It names no
cause the run does not hold.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

from .findings import Finding, FlowRef
from .hop_pairs import JOIN_WINDOW_S, HopLine, caller_side, direction, logged_entries, pair_hops, server_sides
from .unseen import IfaceStats, captured, missing_of, next_look

LOGGERS = ("this sidecar's pool and connection loggers (kubectl meshdoctor watch --envoy-debug: a reused pooled "
           "connection closed by its peer is the keep-alive race)")
_WATCH = "the FIN or RST under the request, and from which port"
_REMEDY = ("# none yet: the cause is not in this evidence. {} this sidecar's debug log (--envoy-debug); the finding "
           "they give prints its fix.")


def unknown_upstream() -> tuple[str, str]:
    """The end of a caller's 503 UC finding (its explanation's last sentence, its remediation) where the upstream
    pod is not known to be in the run: capture it, or this sidecar's debug log. ``point_to_upstream`` recognises
    these words and replaces them where the run holds that pod."""
    return (next_look((), {}, f"the upstream pod's {{}} (kubectl meshdoctor watch pod/<pod>: {_WATCH})", LOGGERS),
            _REMEDY.format("Capture the upstream pod (kubectl meshdoctor watch pod/<pod>)\n# or"))


@dataclass(frozen=True, slots=True)
class HeldPod:
    """One pod of a run: its name, its own IP addresses as the run tells them (Pipeline.addresses), and its
    captures' counts by interface (``lo``, ``eth0`` -> IfaceStats, with the first and last packet's time)."""

    pod: str
    addresses: frozenset[str]
    by_iface: Mapping[str, IfaceStats]


def ip_of(address: str | None) -> str | None:
    """The IP of an ``IP:port`` (``[v6]:port``) address, normalised (ipaddress); None when there is none."""
    host = address.rpartition(":")[0].strip("[]") if address and ":" in address else ""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _asks(f: Finding) -> AccessLogEntry | None:
    """``f``'s caller line of a 503 UC when ``f`` ends with ``unknown_upstream``'s words; None otherwise."""
    tail, remedy = unknown_upstream()
    if f.remediation != remedy or tail not in f.explanation or f.pod is None:
        return None
    return next((e for e in logged_entries(f) if caller_side(e) and "UC" in e.flags and ip_of(e.upstream_host)),
                None)


def _span(entry: AccessLogEntry) -> tuple[float, float]:
    return entry.ts, entry.ts + entry.duration_ms / 1000


def _on_connection(g: Finding, entry: AccessLogEntry) -> bool:
    """Whether ``g`` rests on the line's connection on eth0 (either end's view), near the request's time."""
    flow = g.flow
    if not isinstance(flow, FlowRef) or flow.iface != "eth0" or not entry.upstream_local:
        return False
    start, end = _span(entry)
    return ({flow.client, flow.server} == {entry.upstream_local, entry.upstream_host}
            and start - JOIN_WINDOW_S <= g.ts <= end + JOIN_WINDOW_S)


def _same_request(asking: Sequence[tuple[int, AccessLogEntry]], findings: Sequence[Finding]) -> dict[int, int]:
    """Asking finding -> the finding of another pod quoting the server's line of its request (pair_hops)."""
    lines = [HopLine(findings[i].pod, e) for i, e in asking]
    owner = [i for i, _ in asking]
    for k, g in enumerate(findings):
        for e in logged_entries(g):
            if direction(e) == "inbound" or e.upstream_cluster is None:
                lines.append(HopLine(g.pod, e))
                owner.append(k)
    callers = list(range(len(asking)))
    paired = pair_hops(lines, callers, [s for s in server_sides(lines, callers) if s >= len(asking)])
    return {owner[c]: owner[s] for c, s in paired.items() if findings[owner[s]].pod != findings[owner[c]].pod}


def _connection(entry: AccessLogEntry) -> str:
    return f"{entry.upstream_local} to {entry.upstream_host}" if entry.upstream_local else f"to {entry.upstream_host}"


def held_advice(entry: AccessLogEntry, pod: HeldPod, other: Finding | None, wire: bool = True) -> tuple[str, str]:
    """The end of the finding of caller line ``entry`` (explanation, remediation) where the run holds the upstream
    ``pod``: its ``other`` finding of the same connection (``wire``: on its eth0) or of the same request (its
    sidecar's line of it), else its captures over the request."""
    at = f"This run holds the upstream pod, {pod.pod} ({ip_of(entry.upstream_host)})"
    if other is not None:
        said = f"\"{other.title}\" ({other.detector})"
        on = f"on this connection ({_connection(entry)})" if wire else "of this request (its sidecar's line of it)"
        return (f"{at}, and that pod's own finding {on}, {said}, tells what its evidence shows of it.",
                f"# none from this line alone: see pod {pod.pod}'s finding "
                f"{'on the same connection' if wire else 'of the same request'} ({other.detector}):\n"
                f"# \"{other.title}\"\n# "
                + ("It prints its fix." if other.remediation else "It tells what that pod's evidence shows."))
    given = captured(pod.by_iface, *_span(entry))
    look = {"lo": "on lo, the app's FIN or RST on its sidecar's connection to it under the request",
            "eth0": f"on eth0, this connection ({_connection(entry)}): the FIN or RST and which end sent it, and an "
                    f"RST without ACK from the app's port (conntrack-invalid)"}
    if not given:  # the address alone says it is that pod: nothing of it is of the request's time
        at = f"This run holds pod {pod.pod}, whose address is the upstream's ({ip_of(entry.upstream_host)})"
    seen = (f": look in its capture{'s' * (len(given) > 1)} of {' and '.join(given)} over the request (no finding of "
            f"that pod is on this connection): {'; '.join(look[i] for i in given)}." if given
            else ", but none of its captures covers the request.")
    missing = missing_of(given)
    wanted = [f"pod {pod.pod}'s {missing} (kubectl meshdoctor watch pod/{pod.pod}: {_WATCH})"] * bool(missing)
    held = f"Look in pod {pod.pod}'s capture{'s' * (len(given) > 1)} of {' and '.join(given)} (this run's),\n# "
    return (f"{at}{seen} Capture next: {', and '.join([*wanted, LOGGERS])}.",
            _REMEDY.format((held if given else "") + (f"{'c' if given else 'C'}apture pod {pod.pod}'s {missing} "
                                                      f"(kubectl meshdoctor watch pod/{pod.pod})\n# or" if missing
                                                      else "or capture")))


def point_to_upstream(findings: list[Finding], pods: Iterable[HeldPod]) -> list[Finding]:
    """``findings`` (a run's, of several pods) with each caller's 503 UC finding that asks to capture the upstream
    pod (``unknown_upstream``) told instead what the run holds of that pod, when it holds it: a pod whose
    addresses hold the line's %UPSTREAM_HOST%'s IP, and which is not the caller's own. Each such finding is
    replaced (findings are frozen) with ``details["upstream_pod"]`` naming it; the others are kept as they are."""
    by_ip: dict[str, list[HeldPod]] = {}
    for p in pods:
        for ip in p.addresses:
            by_ip.setdefault(ip, []).append(p)
    if not by_ip:
        return findings
    asking = [(i, e) for i, f in enumerate(findings) if (e := _asks(f)) is not None
              and any(p.pod != f.pod for p in by_ip.get(ip_of(e.upstream_host) or "", ()))]
    if not asking:
        return findings
    request_of = _same_request(asking, findings)
    on_wire: dict[frozenset, list[Finding]] = {}  # by eth0 connection: one look-up an asking finding
    for g in findings:
        if isinstance(g.flow, FlowRef) and g.flow.iface == "eth0":
            on_wire.setdefault(frozenset((g.flow.client, g.flow.server)), []).append(g)
    out = list(findings)
    for i, entry in asking:
        f = findings[i]
        pod = next(p for p in by_ip[ip_of(entry.upstream_host) or ""] if p.pod != f.pod)
        other = next((g for g in on_wire.get(frozenset((entry.upstream_local, entry.upstream_host)), ())
                      if g.pod == pod.pod and _on_connection(g, entry)), None)
        wire = other is not None
        if other is None and i in request_of and findings[request_of[i]].pod == pod.pod:
            other = findings[request_of[i]]
        tail, remedy = held_advice(entry, pod, other, wire)
        out[i] = replace(f, explanation=f.explanation.replace(unknown_upstream()[0], tail), remediation=remedy,
                         details={**f.details, "upstream_pod": pod.pod})
    return out
