"""The inbound redirect map from a pod spec, as istio-iptables builds its nat rules.

Source: istio/istio tools/istio-iptables/pkg/capture/run.go (handleInboundPortsInclude) and the injection
template's annotation -> flag mapping (pkg/kube/inject/template.go, manifests/charts/istio-control/istio-discovery/
files/injection-template.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubectl_meshdoctor.core.events import RedirectMap

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


# ---------------------------------------------------------------------------------------------------- from a Pod

INIT_CONTAINERS = ("istio-init", "istio-validation")  # istio-validation: istio-cni layout (rules applied by the CNI)
_SHORT_FLAGS = {"-b": "b", "-d": "d", "-m": "m", "-z": "z"}
# long forms as tools/istio-iptables/pkg/cmd/root.go names them
_LONG_FLAGS = {"--istio-inbound-ports": "b", "--istio-local-exclude-ports": "d",
               "--istio-inbound-interception-mode": "m", "--inbound-capture-port": "z"}


@dataclass(frozen=True, slots=True)
class PodCapture:
    """How a pod's inbound TCP is captured, read from what was actually applied.

    ``ports`` is the port selection istio-iptables applied (``-b`` / ``-d``, or the annotations the CNI plugin
    reads), whatever the mode; ``mode`` is REDIRECT, TPROXY or NONE; ``path`` / ``value`` say what was read
    (``spec.initContainers[0].args`` or ``metadata.annotations``) so a lint finding can quote it.
    """

    mode: str
    ports: RedirectMap
    path: str
    value: str

    def captured(self, port: int) -> bool:
        """True when an inbound connection to ``port`` is sent to Envoy (REDIRECT or TPROXY)."""
        return self.mode != "NONE" and self.ports.listener_for(port) is not None

    def redirect_map(self) -> RedirectMap:
        """The REDIRECT map (nothing folded unless the mode is REDIRECT), as ``redirect_map_from_annotations``."""
        if self.mode == "REDIRECT":
            return self.ports
        return RedirectMap(include_all=False, included=frozenset(), excluded=self.ports.excluded)


def _init_flags(args: list) -> dict[str, str]:
    out: dict[str, str] = {}
    args = [str(a) for a in args]
    i = 0
    while i < len(args):
        a = args[i]
        name, _, inline = a.partition("=")
        key = _SHORT_FLAGS.get(name) or _LONG_FLAGS.get(name)
        if key and inline:
            out[key] = inline
        elif key and i + 1 < len(args):
            out[key] = args[i + 1]
            i += 1
        i += 1
    return out


def capture_from_pod(pod: dict) -> PodCapture:
    """The inbound capture of a Pod (API JSON, camelCase). Without istio-cni the istio-init arguments are what
    ran, so they win; with istio-cni (istio-validation ... --skip-rule-apply) the CNI plugin reads the pod
    annotations the injector wrote back, so those win; without either, the annotations and Istio's defaults."""
    spec = pod.get("spec") or {}
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    for i, c in enumerate(spec.get("initContainers") or []):
        if c.get("name") not in INIT_CONTAINERS:
            continue
        args = c.get("args") or []
        if "--skip-rule-apply" in args:
            break  # istio-cni: the annotations are authoritative
        flags = _init_flags(args)
        mode = flags.get("m", "REDIRECT").upper()
        listener = int(flags["z"]) if flags.get("z", "").isdigit() else 15006
        excluded = frozenset({15008}) | _ports(flags.get("d"))
        include = flags.get("b", "*").strip()
        if include == "*":
            ports = RedirectMap(listener_port=listener, include_all=True, excluded=excluded)
        else:  # with an explicit -b list istio-iptables writes no RETURN rules for -d
            ports = RedirectMap(listener_port=listener, include_all=False, included=_ports(include),
                                excluded=frozenset({15008}))
        return PodCapture(mode, ports, f"spec.initContainers[{i}].args", " ".join(str(a) for a in args))
    mode = ann.get("sidecar.istio.io/interceptionMode", "REDIRECT").upper()
    include = ann.get("traffic.sidecar.istio.io/includeInboundPorts", "*").strip()
    excluded = ISTIO_EXCLUDED | _ports(ann.get("traffic.sidecar.istio.io/excludeInboundPorts"))
    if include == "*":
        ports = RedirectMap(include_all=True, excluded=excluded)
    else:
        ports = RedirectMap(include_all=False, included=_ports(include), excluded=excluded)
    keys = ("sidecar.istio.io/interceptionMode", "traffic.sidecar.istio.io/includeInboundPorts",
            "traffic.sidecar.istio.io/excludeInboundPorts")
    value = ", ".join(f"{k}={ann[k]!r}" for k in keys if k in ann) or "(none: Istio defaults)"
    return PodCapture(mode, ports, "metadata.annotations", value)
