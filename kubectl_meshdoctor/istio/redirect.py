"""The inbound redirect map from a pod spec, as istio-iptables builds its nat rules.

Source: istio/istio tools/istio-iptables/pkg/capture/run.go (handleInboundPortsInclude) and the injection
template's annotation -> flag mapping; see shared/reference/istio/iptables_rules.txt sections 1, 2 and 5.
"""

from __future__ import annotations

from ..events import RedirectMap

ISTIO_EXCLUDED = frozenset({15008, 15090, 15021, 15020})  # always RETURNed from ISTIO_INBOUND


def _ports(text: str | None) -> frozenset[int]:
    out = set()
    for part in (text or "").split(","):
        part = part.strip()
        if part.isdigit():
            out.add(int(part))
    return frozenset(out)


def redirect_map_from_annotations(annotations: dict[str, str] | None) -> RedirectMap:
    """REDIRECT map for a pod with these annotations (None or {} means Istio's defaults: every port but the
    excluded ones goes to 15006). ``interceptionMode: NONE`` captures nothing; TPROXY keeps the ports but not
    the REDIRECT (the four-tuple is not folded), so it maps nothing either."""
    ann = annotations or {}
    mode = ann.get("sidecar.istio.io/interceptionMode", "REDIRECT").upper()
    excluded = ISTIO_EXCLUDED | _ports(ann.get("traffic.sidecar.istio.io/excludeInboundPorts"))
    if mode != "REDIRECT":
        return RedirectMap(include_all=False, included=frozenset(), excluded=excluded)
    include = ann.get("traffic.sidecar.istio.io/includeInboundPorts", "*").strip()
    if include == "*":
        return RedirectMap(include_all=True, excluded=excluded)
    return RedirectMap(include_all=False, included=_ports(include), excluded=excluded)
