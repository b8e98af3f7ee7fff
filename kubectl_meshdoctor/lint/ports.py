"""The rules on which app ports Istio's iptables capture: redirect-exposure (two or more REDIRECTed onto one
listener) and excluded-port-exposed (one left out of capture).

Source: istio/istio tools/istio-iptables/pkg/capture/run.go and the injection template's annotation -> flag
mapping.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.findings import Finding, Severity
from kubectl_meshdoctor.core.fixes import Fix, render
from kubectl_meshdoctor.core.remedies import exclude_inbound_ports, tproxy_interception

from .podview import ANN_EXCLUDE, ANN_INCLUDE, PodView, rule

ISTIO_OWN_EXCLUDES = {15090, 15021, 15020, 15008}


def _ports_text(ports: Iterable[int]) -> str:
    return ",".join(str(p) for p in ports)


def _user_excludes(pv: PodView) -> list[int]:
    """The excludeInboundPorts the user set (Istio's own ports dropped), from what was applied."""
    if pv.capture.path.startswith("spec.initContainers"):
        nums = pv.capture.ports.excluded
    else:
        nums = {int(p) for p in str(pv.annotations.get(ANN_EXCLUDE, "")).split(",") if p.strip().isdigit()}
    return sorted(p for p in nums if p not in ISTIO_OWN_EXCLUDES)


@rule("redirect-exposure", "warning")
def redirect_exposure(pv: PodView) -> list[Finding]:
    """Two or more app ports REDIRECTed to the one inbound listener.

    Decision on TPROXY: not reported. TPROXY (mangle ISTIO_TPROXY, iptables_rules.txt section 6) delivers the
    packet to Envoy's transparent listener without rewriting the destination, so the accepted socket keeps the
    original (pod ip, app port): connections to two ports from one client ip:port stay distinct four-tuples.
    REDIRECT is a DNAT to 15006: both become (pod ip, 15006, client ip, client port), the same socket key.
    NONE captures nothing.
    """
    if pv.sidecar is None or pv.capture.mode != "REDIRECT":
        return []
    cap = pv.capture
    captured = [p for p in pv.app_ports() if cap.captured(p.port)]
    if len(captured) < 2:
        return []
    keep, move = captured[0], captured[1:]
    listener = cap.ports.listener_port
    exclude_value = _ports_text(sorted(set(_user_excludes(pv)) | {p.port for p in move}))
    move_text = _ports_text(p.port for p in move)
    ports_text = ", ".join(str(p.port) for p in captured)
    # The collision's own fixes (core/remedies.py), the mesh kept first; what tuple-collision prints too.
    fixes = (tproxy_interception(), exclude_inbound_ports(exclude_value, move_text))
    remediation = render(fixes, note=f"# (instead of excluding: list only what stays captured, "
                                      f"{ANN_INCLUDE}: \"{keep.port}\")")
    explanation = (
        f"istio-iptables REDIRECTs every captured inbound TCP port to Envoy's virtualInbound listener on {listener} "
        f"(nat ISTIO_INBOUND -> ISTIO_IN_REDIRECT 'REDIRECT --to-ports {listener}'; which ports from -b/-d, i.e. "
        f"{ANN_INCLUDE} / {ANN_EXCLUDE}; source istio/istio tools/istio-iptables/pkg/capture/run.go, "
        f"iptables_rules.txt sections 1, 2 and 5). Here {ports_text} are all captured. REDIRECT rewrites the "
        f"destination port, so a connection from client ip:port X to {captured[0].port} and one from the same X to "
        f"{captured[1].port} are the same kernel four-tuple (pod ip, {listener}, X): if a client reuses a source "
        f"port across these ports (fixed bind, SO_REUSEADDR port pools, a NAT in front) while the first "
        f"connection lives, the second SYN gets a challenge ACK or is dropped, a 1-3 s connect stall the client "
        f"Envoy logs as UF/URX. This is an exposure read from the spec, not an observed failure; `watch` reports "
        f"the failure as tuple-collision. TPROXY mode is not reported: it does not rewrite the destination port, "
        f"so the four-tuples stay distinct."
    )
    evidence = pv.capture_evidence() + [f"{p.path} = {p.port}" for p in captured]
    return [pv.finding(
        "redirect-exposure", Severity.WARNING,
        f"app ports {ports_text} are all REDIRECTed to the one inbound listener {listener}",
        move[0].port, evidence, move[0].path, explanation, remediation, fixes=fixes,
        ports=[p.port for p in captured], listener=listener, exclude=exclude_value,
        capture_path=cap.path,
    )]


@rule("excluded-port-exposed", "info")
def excluded_port_exposed(pv: PodView) -> list[Finding]:
    """An app port the sidecar does not capture: it is reachable around Envoy."""
    if pv.sidecar is None or pv.capture.mode == "NONE":
        return []
    out = []
    for p in pv.app_ports():
        if pv.capture.captured(p.port):
            continue
        ev = [f"{p.path} = {p.port}", *pv.capture_evidence()]
        rest = _ports_text(q for q in _user_excludes(pv) if q != p.port)
        # An empty list excludes nothing (istio-iptables -d ""), as the annotation's absence does.
        fixes = (Fix(
            "capture-port", f"capture {p.port} again (the annotation lists the ports that must still bypass Envoy"
                            f"{': ' + rest if rest else ': none'})",
            f"mTLS, policy and telemetry on {p.port}",
            f"if two captured ports are dialled from one client ip:port under REDIRECT, they can collide "
            f"(redirect-exposure; TPROXY avoids it); a non-mesh client of {p.port} then needs mTLS "
            f"(or PeerAuthentication PERMISSIVE); the pods are recreated to apply it",
            annotations=((ANN_EXCLUDE, rest),)),)
        note = (f"# If {p.port} must bypass Envoy on purpose, restrict who can reach it with a Kubernetes "
                f"NetworkPolicy on port {p.port}.\n" + pv.recreate_note())
        out.append(pv.finding(
            "excluded-port-exposed", Severity.INFO,
            f"app port {p.port} ({p.container}) is not captured by the sidecar: reachable without mTLS or policy",
            p.port, ev, p.path,
            f"Port {p.port} is left out of inbound capture ({pv.capture.path}: RETURNed before ISTIO_IN_REDIRECT, "
            f"iptables_rules.txt section 5). Connections to it reach the app directly: no mTLS termination, "
            f"PeerAuthentication STRICT and AuthorizationPolicy do not apply, no Envoy telemetry. Fine for a "
            f"port that must bypass Envoy on purpose (metrics scraped by a non-mesh Prometheus, or "
            f"redirect-exposure's second fix where TPROXY is not possible); otherwise a hole in the mesh.",
            render(fixes, note), fixes=fixes, port=p.port))
    return out
