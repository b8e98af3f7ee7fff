"""The rules on the istio-proxy sidecar itself: no-sidecar, sidecar-not-ready, hold-application (whether the
app can start before it)."""

from __future__ import annotations

from datetime import datetime

import yaml

from kubectl_meshdoctor.core.events import ContainerExit, PodEvent
from kubectl_meshdoctor.core.findings import Finding, Severity
from kubectl_meshdoctor.core import remedies
from kubectl_meshdoctor.core.fixes import Fix, render

from .podview import ANN_PROXY_CONFIG, ANN_STATUS, SIDECAR, PodView, json_key, rule

ANN_INJECT = "sidecar.istio.io/inject"  # a label (the annotation of that name is its deprecated form)


def inject_fix(namespace: str, opted_out: bool = False) -> Fix:
    """no-sidecar's fix: the pod template label the injector reads first (istio/istio pkg/kube/inject
    inject.go injectRequired: the label over the annotation, "true" or "false" over the namespace's policy), so
    it also undoes a pod's own opt-out, which no namespace label does."""
    where = ("# Pod template: its own sidecar.istio.io/inject \"false\" wins over any namespace label, so turn it "
             "round:" if opted_out else
             f"# Per workload (pod template), or for the whole namespace: kubectl label namespace {namespace} "
             f"istio-injection=enabled")
    return Fix(
        "inject-sidecar", "have the injector add the sidecar to the workload's pods",
        "nothing is lost: the pod joins the mesh (mTLS, policy, telemetry)",
        "the pods are recreated to get it; a pod in a namespace with STRICT mTLS peers must have it to be "
        "reached at all",
        yaml=f"{where}\nmetadata:\n  labels:\n    {ANN_INJECT}: \"true\"",
        labels=((ANN_INJECT, "true"),))


# A pod that asks for the sidecar and has none was not seen by the injector: where to look, no fix to apply.
ASKED_NOTE = ("# Not a fix the spec proves: the pod asks for the sidecar, so the injector did not see it. Recreate "
              "it\n# ({restart}); if it comes back without one, the "
              "webhook is not called\n# for it: kubectl get mutatingwebhookconfiguration -l app=sidecar-injector "
              "-o yaml (its namespaceSelector\n# and objectSelector; a namespace on istio.io/rev needs that "
              "revision's webhook), and istiod's log.")


@rule("no-sidecar", "error")
def no_sidecar(pv: PodView) -> list[Finding]:
    if pv.sidecar is not None:
        return []
    names = ", ".join(c.name for c in pv.containers) or "none"
    inits = ", ".join(f"{c.name}{' (restartPolicy Always)' if c.restartable_init else ''}"
                      for c in pv.init_containers) or "none"
    status = pv.annotations.get(ANN_STATUS)
    ev = [f"spec.containers[*].name = {names}", f"spec.initContainers[*].name = {inits}",
          f"metadata.annotations[{json_key(ANN_STATUS)}] = {status if status is not None else '(absent)'}"]
    said = [(where, str(d[ANN_INJECT])) for where, d in (("metadata.labels", pv.labels),
                                                        ("metadata.annotations", pv.annotations)) if ANN_INJECT in d]
    ev += [f"{where}[{json_key(ANN_INJECT)}] = {value}" for where, value in said]
    # The injector reads the label, else the annotation, and takes only "true" and "false" (injectRequired).
    selector = said[0][1] if said else ""
    if selector == "false":
        why = f"The pod opts out of injection ({said[0][0]}[{json_key(ANN_INJECT)}] = false)."
    elif selector == "true":
        why = (f"The pod asks for injection ({said[0][0]}[{json_key(ANN_INJECT)}] = true) and has no sidecar: the "
               f"injector did not see it (created before the injector ran or while it was down, or a webhook "
               f"that does not select it).")
    else:
        why = ("Injection happens only at pod creation by the istio-sidecar-injector webhook, when the namespace "
               "has istio-injection=enabled or istio.io/rev, or the pod has sidecar.istio.io/inject: \"true\"; a "
               "pod created before that, or in a namespace without the label, has none.")
        if selector:
            why += f" Its {ANN_INJECT} value {selector!r} is neither true nor false, which Istio ignores."
    if status is not None:
        why += f" The {ANN_STATUS} annotation says it was injected, so the container was removed afterwards."
    ambient = pv.annotations.get("ambient.istio.io/redirection") == "enabled"
    if ambient:
        why += " The pod is in ambient mode (ambient.istio.io/redirection: enabled): no sidecar by design."
    if selector == "true":
        fixes: tuple[Fix, ...] = ()
        remediation = ASKED_NOTE.format(restart=pv.restart_command())
    else:
        fixes = (inject_fix(pv.namespace, opted_out=selector == "false"),)
        remediation = render(fixes, note=pv.recreate_note())
    return [pv.finding(
        "no-sidecar", Severity.INFO if ambient else Severity.ERROR,
        f"pod {pv.name} has no {SIDECAR} sidecar (neither a container nor a native-sidecar init container)",
        None, ev, "spec.containers[*].name",
        f"No container named {SIDECAR} in spec.containers (classic layout) and no init container {SIDECAR} with "
        f"restartPolicy: Always (native sidecar, Istio >= 1.28 on Kubernetes >= 1.33; pod_istio_sample.yaml). "
        f"Without it the pod is outside the mesh: no mTLS, no policy, nothing for meshdoctor to capture. {why}",
        remediation, fixes=fixes, containers=[c.name for c in pv.containers])]


@rule("sidecar-not-ready", "error")
def sidecar_not_ready(pv: PodView) -> list[Finding]:
    if pv.sidecar is None or SIDECAR not in pv.statuses:
        return []
    st, spath = pv.statuses[SIDECAR]
    state = st.get("state") or {}
    ready = bool(st.get("ready"))
    if ready and "running" in state:
        return []
    ev = [f"{spath}.ready = {str(ready).lower()}"]
    if "running" in state:
        detail, path = "running but not ready", f"{spath}.ready"
    else:
        which = next(iter(state), "unknown")
        reason = (state.get(which) or {}).get("reason") or ""
        detail, path = f"{which}{': ' + reason if reason else ''}", f"{spath}.state.{which}"
        ev.append(f"{path}.reason = {reason or '(none)'}")
    layout = "native sidecar (init container)" if pv.native else "classic sidecar"
    return [pv.finding(
        "sidecar-not-ready", Severity.ERROR, f"{SIDECAR} of pod {pv.name} is not ready ({detail})", None, ev, path,
        f"The {layout} {SIDECAR} is {detail}. Its readiness is Envoy's /healthz/ready on 15021, which turns true "
        f"only once Envoy got its first configuration from istiod (listeners and clusters) and certificates. "
        f"While it is not ready every captured inbound and outbound connection of the pod fails or hangs "
        f"(iptables still REDIRECTs to 15006/15001), and the pod is out of its Services' endpoints. Common causes: "
        f"istiod unreachable (port 15012), a rejected config (LDS/CDS NACK), certificate issues.",
        f"# Not a fix the spec proves: why the proxy is not ready is in its log and in istiod's view of it; read "
        f"them first.\nkubectl logs {pv.name} -c {SIDECAR} -n {pv.namespace} --tail=100\n"
        f"istioctl proxy-status {pv.name}.{pv.namespace}\n"
        f"kubectl exec {pv.name} -c {SIDECAR} -n {pv.namespace} -- pilot-agent request GET /healthz/ready",
        ready=ready, native=pv.native)]


def _hold_effective(pv: PodView) -> tuple[bool, str]:
    """Native sidecars start (and pass their startupProbe) before app containers; a classic sidecar holds the
    app only when the injector put it first with a postStart `pilot-agent wait` hook."""
    if pv.native:
        return True, "native sidecar"
    first = pv.containers[0] if pv.containers else None
    if first is None or first.name != SIDECAR:
        return False, ""
    cmd = ((((first.spec.get("lifecycle") or {}).get("postStart") or {}).get("exec") or {}).get("command")) or []
    return ("pilot-agent" in cmd and "wait" in cmd), "postStart pilot-agent wait"


@rule("hold-application", "warning")
def hold_application(pv: PodView) -> list[Finding]:
    if pv.sidecar is None:
        return []
    effective, _ = _hold_effective(pv)
    if effective:
        return []
    raw = pv.annotations.get(ANN_PROXY_CONFIG)
    cfg, invalid = {}, False
    if raw:
        try:
            cfg = yaml.safe_load(str(raw)) or {}
        except yaml.YAMLError:
            cfg, invalid = {}, True
        if not isinstance(cfg, dict):
            cfg, invalid = {}, True
    ann_path = f"metadata.annotations[{json_key(ANN_PROXY_CONFIG)}]"
    idx = next(i for i, c in enumerate(pv.containers) if c.name == SIDECAR)
    ev = [f"{ann_path} = {raw.strip() if raw else '(absent)'}",
          f"spec.containers[{idx}].name = {SIDECAR} (position {idx + 1} of {len(pv.containers)}, "
          f"no postStart pilot-agent wait)"]
    asked = cfg.get("holdApplicationUntilProxyStarts") is True
    cfg = {**cfg, "holdApplicationUntilProxyStarts": True}
    title = (f"pod {pv.name} asks for holdApplicationUntilProxyStarts but was injected without it" if asked else
             f"app containers of pod {pv.name} can start before the {SIDECAR} sidecar is ready")
    explanation = (
        f"With a classic sidecar Kubernetes starts all containers at once, so the app can run before Envoy has its "
        f"configuration: iptables already REDIRECTs the app's outbound connections to 15001, and start-up calls "
        f"(config server, database, token fetch) can fail before Envoy is ready (connection refused/reset, 503), "
        f"often ending in a restart loop. holdApplicationUntilProxyStarts makes the injector put {SIDECAR} first "
        f"with a postStart hook `pilot-agent wait` that blocks the next containers until Envoy is ready "
        f"(istio/istio injection-template.yaml; Istio >= 1.7); native sidecars (Istio >= 1.28 on Kubernetes >= "
        f"1.33) start first by design.")
    if asked:
        explanation += (" The annotation already asks for it but the pod was injected before it was set (or the "
                        "injector ignored it): the spec shows no hold. Recreate the pod.")
    if invalid:
        explanation += (f" Its {ANN_PROXY_CONFIG} annotation is not a ProxyConfig mapping in YAML, which Istio's "
                        f"injector refuses (ApplyProxyConfig), so the pod was injected before it was set.")
    value = yaml.safe_dump(cfg, default_flow_style=False, sort_keys=False).rstrip("\n")
    fixes = (remedies.hold_application(value, replaces_invalid=invalid),)
    return [pv.finding("hold-application", Severity.WARNING, title, None, ev, ann_path, explanation,
                       render(fixes, note=pv.recreate_note()), fixes=fixes,
                       annotation_asks=asked, annotation_invalid=invalid)]


def _rfc3339(text: object) -> float | None:
    """An API timestamp (RFC 3339, seconds) as seconds since the epoch; None when absent or not one."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _started_at(status: dict) -> float | None:
    """A container status's ``state.running.startedAt`` as seconds since the epoch."""
    return _rfc3339(((status.get("state") or {}).get("running") or {}).get("startedAt"))


def _pod_ips(pod: dict) -> tuple[str, ...]:
    """The pod's addresses: ``status.podIPs[].ip``, else ``status.podIP``."""
    status = pod.get("status") or {}
    ips = [str(x.get("ip")) for x in status.get("podIPs") or () if isinstance(x, dict) and x.get("ip")]
    return tuple(ips) or ((str(status["podIP"]),) if status.get("podIP") else ())


def _last_exit(status: dict) -> ContainerExit | None:
    """How a container's latest run ended: its ``state.terminated`` while it is down, else its
    ``lastState.terminated`` (the run before this one)."""
    down = (status.get("state") or {}).get("terminated")
    done = down if isinstance(down, dict) else (status.get("lastState") or {}).get("terminated")
    if not isinstance(done, dict):
        return None
    try:
        code = int(done.get("exitCode"))
    except (TypeError, ValueError):
        return None
    return ContainerExit(_rfc3339(done.get("finishedAt")), code, str(done.get("reason") or ""), done is down)


def pod_event(pod: dict, ts: float) -> PodEvent:
    """What the pod's status and spec say of its start, for the detectors (core/events.py PodEvent): the app
    containers' restarts (the sidecar's aside, as `kubectl get pod` counts them), istio-proxy's restarts and when
    its current run and the first app container's began, and how the spec holds the app until the proxy is
    ready (hold-application's reading: "native sidecar", "postStart pilot-agent wait", or ""; None without a
    sidecar). ``pod``: the API's JSON (camelCase)."""
    pv = PodView(pod)
    sidecar = pv.statuses.get(SIDECAR, ({}, ""))[0]
    apps = [pv.statuses[c.name][0] for c in pv.app_containers if c.name in pv.statuses]
    app_starts = [t for t in map(_started_at, apps) if t is not None]
    return PodEvent(ts, pv.name, sum(int(st.get("restartCount") or 0) for st in apps),
                    sidecar_restarts=int(sidecar.get("restartCount") or 0), sidecar_started=_started_at(sidecar),
                    sidecar_last_exit=_last_exit(sidecar), ips=_pod_ips(pod),
                    app_started=min(app_starts) if app_starts else None,
                    hold=None if pv.sidecar is None else _hold_effective(pv)[1])
