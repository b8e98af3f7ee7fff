"""The pod lab's public API: `up`, `down`, `status`, and `trigger_round` for deterministic tests.

`up` builds one network namespace pair per pod (netns.py), starts the apps and real Envoy (istio_proxy.py, with
a bootstrap shaped like Istio's sidecar: bootstrap.py) inside the pod namespace, the scenario driver inside the
client namespace, then the test API server; each process is detached (own session, output to a log file in
state_dir) and recorded in state_dir/state.json. `down` undoes all of it from that file alone, so it works after
a crash or a half-finished `up`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from meshdoctor_lab import applied_fixes as lab_fixes
from meshdoctor_lab import istio_proxy, netns, pki, processes
from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
from meshdoctor_lab.bootstrap import (
    ADMIN_PORT,
    OUTBOUND_PORT,
    BootstrapPod,
    SidecarSettings,
    bootstrap_text,
)
from meshdoctor_lab.caller_sidecar import CallerPod, caller_bootstrap_text
from meshdoctor_lab.netns import DEFAULT_LAB_NAME, INBOUND_CAPTURE_PORT
from meshdoctor_lab.outbound import service_host, spiffe_id
from meshdoctor_lab.scenarios import (
    DEFAULT_PERIOD,
    DEFAULT_ROUNDS,
    DEFAULT_SECONDS,
    SCENARIOS,
    SETUPS,
    PodSetup,
    RoundResult,
)
from meshdoctor_lab.state import (
    LabError,
    LabObservation,
    LabPod,
    LabPort,
    LabState,
    MeshOptions,
    caller_pod_name,
    read_state,
    write_state,
)

__all__ = [
    "LabError", "LabState", "LabPod", "MeshOptions", "RoundResult", "access_log_path", "caller_log_path",
    "default_state_dir", "up",
    "down", "status",
    "trigger_round",
]

STATE_ROOT = Path("/run/kubectl-meshdoctor")
DEFAULT_PODS = ("collision", "healthy")


def default_state_dir(name: str = DEFAULT_LAB_NAME) -> Path:
    """/run/kubectl-meshdoctor/<name>: tmpfs, so a reboot (which also drops the namespaces) forgets the lab."""
    return STATE_ROOT / name


def up(
    name: str = DEFAULT_LAB_NAME,
    state_dir: Path | None = None,
    pods: Sequence[str] = DEFAULT_PODS,
    *,
    rounds: int = DEFAULT_ROUNDS,
    seconds: float = DEFAULT_SECONDS,
    period: float = DEFAULT_PERIOD,
    drivers: bool = True,
    apiserver: bool = True,
    ready_timeout: float = 20.0,
    spec_patches: Mapping[str, Sequence[dict]] | None = None,
    mesh: MeshOptions = MeshOptions(),
    fixes: Mapping[str, lab_fixes.LabFix] | None = None,
    on_start: Callable[[LabState], None] | None = None,
) -> LabState:
    """Build the lab and return its state (also written to state_dir/state.json).

    `pods` are scenario names (one of SCENARIOS), or `name=scenario` for several pods of one scenario;
    each becomes a pod of that name. The scenario drivers run
    at most `rounds` rounds, one every `period` seconds, for at most `seconds` seconds; `drivers=False`
    leaves the lab quiet (use `trigger_round`). `ready_timeout` (seconds) bounds each readiness wait.
    `spec_patches` maps a pod name to RFC 6902 operations the test API server applies to its Pod object
    (a spec or status that breaks a lint rule; the pod's network is unchanged). `mesh` holds the mesh-wide
    settings every pod's Envoy gets (access-log encoding, Istio < 1.10's inbound dialling), and whether each
    pod's client calls it through a caller sidecar (caller_sidecar.py; its log: caller_log_path). `fixes` maps a pod
    name to the printed fix applied to it, as Istio would render it (lab/fixes.py; an unknown one: LabError).
    `on_start` is called once every check has passed, before the slow part (namespaces, processes).

    A pod whose sidecar speaks mTLS (its scenario's PeerAuthentication or DestinationRule) gets certificates from
    a lab CA (pki.py) in state_dir/POD/certs.

    Raises LabError when not root, a tool (openssl, for an mTLS pod) or a dependency of the lab (Envoy, aiohttp) is
    missing, a pod name is unknown or repeated, state_dir is not empty, a lab already uses state_dir or its
    namespaces, or a process does not become ready. On any failure everything already created is removed again.
    """
    state_dir = Path(state_dir) if state_dir is not None else default_state_dir(name)
    envoy = _preflight(pods, mesh)
    if (state_dir / "state.json").exists():
        raise LabError(f"a lab already has state in {state_dir}; run `lab down --name {name}` first")
    if state_dir.exists() and any(state_dir.iterdir()):
        # `down` removes the whole directory, so it must hold nothing but the lab's own files.
        raise LabError(f"state directory {state_dir} is not empty; pick a new one")
    prefix = netns.netns_prefix(name)
    state = LabState(
        name=name,
        namespace=name,
        state_dir=state_dir,
        kubeconfig=state_dir / "kubeconfig",
        netns_prefix=prefix,
        pods=tuple(_with_certs(_with_fix(replace(pod, spec_patch=tuple((spec_patches or {}).get(pod.name, ()))),
                                         (fixes or {}).get(pod.name)), state_dir, mesh)
                   for pod in (replace(_new_pod(prefix, i, spec), caller="sidecar" if mesh.caller_sidecar else "")
                               for i, spec in enumerate(pods, start=1))),
        mesh=mesh,
    )
    _refuse_tproxy_to_localhost(state)
    if any(pod.certs for pod in state.pods) and shutil.which("openssl") is None:
        raise LabError("the lab needs openssl for the certificates of its mTLS pods")
    taken = [ns for ns in _all_netns(state) if netns.netns_exists(ns)]
    if taken:
        # Refuse before writing any state: the cleanup below deletes every namespace the state names.
        raise LabError(f"network namespace {taken[0]} already exists (another lab named {name}?); run `lab down`")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written before anything exists, so a failed or interrupted `up` can always be undone by `down`.
    write_state(state)
    try:
        if on_start is not None:
            on_start(state)
        state = _bring_up(state, envoy, rounds=rounds, seconds=seconds, period=period, drivers=drivers,
                          apiserver=apiserver, ready_timeout=ready_timeout)
    except BaseException:
        try:
            down(state_dir)
        except LabError:
            pass  # the first error is the one the user needs
        raise
    return state


def down(state_dir: Path) -> None:
    """Stop every process the lab started, delete its namespaces and remove state_dir. Idempotent.

    Raises LabError when something could not be removed (the message names it).
    """
    state_dir = Path(state_dir)
    try:
        state = read_state(state_dir)
    except (ValueError, KeyError) as exc:
        raise LabError(f"{state_dir}/state.json is not a lab state ({exc}); remove it by hand") from None
    if state is None:
        return  # nothing of ours here (and a directory without our state file is not ours to remove)
    leftovers: list[str] = []
    for key, pid in state.pids.items():
        if not processes.stop(pid, state.started.get(key)):
            leftovers.append(f"process {key} (pid {pid})")
    for ns in _all_netns(state):
        # Anything still inside our namespaces was started there by us or by a test (e.g. tcpdump).
        for pid in netns.netns_pids(ns):
            if not processes.stop(pid, None):
                leftovers.append(f"process {pid} in {ns}")
        try:
            netns.delete_netns(ns)
        except LabError as exc:
            leftovers.append(str(exc))
    if leftovers:
        raise LabError("lab down left behind: " + "; ".join(leftovers))
    shutil.rmtree(state_dir, ignore_errors=True)


def status(state_dir: Path) -> LabState | None:
    """The lab's state with `observed` filled in (which processes run, which namespaces exist).

    Returns None when state_dir holds no lab. Raises LabError when the state file is unreadable.
    """
    try:
        state = read_state(Path(state_dir))
    except (ValueError, KeyError) as exc:
        raise LabError(f"{state_dir}/state.json is not a lab state ({exc})") from None
    if state is None:
        return None
    running = tuple(k for k, pid in state.pids.items() if processes.live_process(pid, state.started.get(k)) is not None)
    all_ns = _all_netns(state)
    present = tuple(ns for ns in all_ns if netns.netns_exists(ns))
    observed = LabObservation(
        running=running,
        dead=tuple(k for k in state.pids if k not in running),
        netns_present=present,
        netns_missing=tuple(ns for ns in all_ns if ns not in present),
    )
    return replace(state, observed=observed)


def trigger_round(state: LabState, pod: str, scenario: str | None = None, timeout: float = 60.0) -> RoundResult:
    """Run one scenario round now, in the pod's client namespace, and return its result.

    `scenario` defaults to the pod's own. `timeout` is in seconds. Raises LabError when the pod is unknown
    or the driver fails or times out.
    """
    try:
        lab_pod = state.pod(pod)
    except KeyError:
        raise LabError(f"the lab has no pod {pod!r}") from None
    argv = netns.in_netns(lab_pod.client_netns, *_driver_args(lab_pod, scenario or lab_pod.scenario,
                                                             rounds=1, seconds=timeout, period=0.0))
    out = netns.run(argv, timeout=timeout + 5.0)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise LabError(f"scenario driver for {pod} printed no result")
    return RoundResult.from_json(json.loads(lines[-1]))


def _preflight(pods: Sequence[str], mesh: MeshOptions) -> str:
    """Check what `up` needs before anything is created; returns the Envoy binary's path."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, iptables, conntrack): run it with sudo")
    missing = netns.missing_tools()
    if missing:
        raise LabError(f"the lab needs {', '.join(missing)} on PATH (iproute2, iptables, conntrack, procps)")
    specs = [pod_spec(p) for p in pods]
    unknown = [scenario for _, scenario in specs if scenario not in SCENARIOS]
    if unknown:
        raise LabError(f"unknown lab pod {unknown[0]!r} (one of {', '.join(SCENARIOS)})")
    names = [name for name, _ in specs]
    bad = [n for n in names if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", n)]
    if bad:
        raise LabError(f"lab pod name {bad[0]!r} must be lower case letters, digits and -, at most 40")
    if len(set(names)) != len(names):
        raise LabError("each lab pod name may appear once")
    if not pods:
        raise LabError("the lab needs at least one pod")
    try:
        SidecarSettings(access_log_encoding=mesh.access_log_encoding)  # refused here, before anything exists
    except ValueError as exc:
        raise LabError(str(exc)) from None
    if importlib.util.find_spec("aiohttp") is None:
        raise LabError("the lab's test API server needs aiohttp: from the repository, pip install ./lab (or scripts/install)")
    envoy = istio_proxy.envoy_binary()
    istio_proxy.check_envoy(envoy)
    return envoy


def pod_spec(text: str) -> tuple[str, str]:
    """``scenario`` or ``name=scenario`` (several pods of one scenario: ``web-1=healthy,web-2=healthy``)."""
    name, sep, scenario = text.partition("=")
    return (name, scenario) if sep else (text, text)


def _new_pod(prefix: str, index: int, spec: str) -> LabPod:
    name, scenario = pod_spec(spec)
    client_ip, pod_ip = netns.pod_addresses(index)
    return LabPod(
        name=name,
        scenario=scenario,
        netns=f"{prefix}-{name}",
        client_netns=f"{prefix}-{name}-c",
        pod_ip=pod_ip,
        client_ip=client_ip,
        ports=(LabPort("http", HTTP_PORT), LabPort("tcp-echo", ECHO_PORT)),
        uid=str(uuid.uuid4()),
    )


def _refuse_tproxy_to_localhost(state: LabState) -> None:
    """Raises LabError for a pod under TPROXY whose sidecar would dial the app on 127.0.0.1: original_src dials
    from the client's address, which cannot reach it (seen with Envoy 1.40: every request hangs, then DC)."""
    for pod in state.pods:
        _, setup = _pod_setup(pod, state)
        if setup.sidecar.interception_mode == "TPROXY" and setup.sidecar.legacy_inbound:
            raise LabError(f"pod {pod.name}: TPROXY interception cannot reach an app on 127.0.0.1 (the sidecar "
                           f"dials it from the client's address); leave out --legacy-inbound")


def _pod_setup(pod: LabPod, state: LabState, *, as_caller: bool = False) -> tuple[lab_fixes.PodFix, PodSetup]:
    """The pod's fix and its scenario's setup with that fix and the mesh-wide settings applied.

    With a caller sidecar (state.mesh.caller_sidecar) the pod's own sidecar is rendered as in a mesh: Istio's
    default PERMISSIVE mTLS unless the scenario sets a mode, and its inbound route no longer stands in for the
    caller's (a VirtualService's timeout, retries and match prefixes go on the caller's route, a DestinationRule's
    outlierDetection and tls on its outbound cluster: ``as_caller`` gives the settings the caller sidecar renders
    them from)."""
    fix = lab_fixes.pod_fix(pod.fix, pod.annotations, pod.settings, pod.labels)
    setup = fix.setup(_scenario_setup(pod))
    sidecar = replace(setup.sidecar, access_log_encoding=state.mesh.access_log_encoding,
                      legacy_inbound=state.mesh.legacy_inbound or setup.sidecar.legacy_inbound,
                      interception_mode=fix.interception)
    if as_caller and setup.callers_tls_mode and sidecar.upstream_tls_mode is None:
        sidecar = replace(sidecar, upstream_tls_mode=setup.callers_tls_mode)
    if state.mesh.caller_sidecar and not as_caller:
        # istiod renders outlierDetection, a DestinationRule's tls and a VirtualService's routes on the callers'
        # outbound cluster and route only; connectionPool goes on this pod's inbound cluster as well
        sidecar = replace(sidecar, mtls_mode=sidecar.mtls_mode or "PERMISSIVE", route_timeout_s=None,
                          route_retry_on=None, route_retries=None, outlier_consecutive_5xx=None,
                          outlier_interval_s=None, outlier_base_ejection_s=None, outlier_max_ejection_percent=None,
                          outlier_min_health_percent=0, upstream_tls_mode=None, vs_prefixes=(), vs_catch_all=False)
    return fix, replace(setup, sidecar=sidecar)


def _scenario_setup(pod: LabPod) -> PodSetup:
    """The pod's scenario's setup; called through a caller sidecar, with its ``called_labels`` if it has any."""
    setup = SETUPS[pod.scenario]
    if pod.caller == "sidecar" and setup.called_labels is not None:
        setup = replace(setup, labels=setup.called_labels)
    return setup


def _with_fix(pod: LabPod, fix: lab_fixes.LabFix | None) -> LabPod:
    """``pod`` with ``fix`` applied, and its template labels (its scenario's, under a caller sidecar its
    ``called_labels`` if set, the fix's over them). Raises LabError for a fix the lab cannot apply."""
    fix = fix or lab_fixes.LabFix("")
    applied = lab_fixes.pod_fix(fix.name, fix.annotations, fix.settings, fix.labels)
    setup = applied.setup(_scenario_setup(pod))
    # the :5002 port's name says its protocol to Istio (port_kind): the scenario's, or the one a fix gives it
    ports = tuple(replace(p, name=setup.tcp_port_name) if p.port == ECHO_PORT else p for p in pod.ports)
    return replace(pod, fix=applied.name, annotations=applied.annotations, settings=applied.settings,
                   labels=setup.labels, ports=ports)


def _with_certs(pod: LabPod, state_dir: Path, mesh: MeshOptions) -> LabPod:
    """``pod`` with the directory of its certificates when its sidecar speaks mTLS (a PeerAuthentication mode, a
    DestinationRule's ISTIO_MUTUAL, with its fix applied; every sidecar when callers have one)."""
    fix = lab_fixes.pod_fix(pod.fix, pod.annotations, pod.settings, pod.labels)
    setup = fix.setup(_scenario_setup(pod))
    sidecar = setup.sidecar
    mtls = sidecar.mtls_mode is not None or sidecar.upstream_tls_mode == "ISTIO_MUTUAL"
    # a caller sidecar holds its certificate (the pod's callers') whether or not the pod it calls has a sidecar
    if not ((mtls and lab_fixes.injected(setup.labels)) or mesh.caller_sidecar):
        return pod
    return replace(pod, certs=str(state_dir / pod.name / "certs"))


def _all_netns(state: LabState) -> list[str]:
    return [ns for pod in state.pods for ns in (pod.netns, pod.client_netns)]


def _bring_up(
    state: LabState, envoy: str, *, rounds: int, seconds: float, period: float, drivers: bool, apiserver: bool,
    ready_timeout: float,
) -> LabState:
    roles_of: dict[str, list[str]] = {}
    for pod in state.pods:
        fix, setup = _pod_setup(pod, state)
        # A pod the injector leaves alone has no istio-init: no capture rules (NONE), and no sidecar below.
        netns.create_pod_network(pod.netns, pod.client_netns, pod.pod_ip, pod.client_ip,
                                 local_ports=setup.local_ports,
                                 interception=fix.interception if lab_fixes.injected(setup.labels) else "NONE",
                                 excluded_ports=fix.excluded_ports, drop_invalid=fix.drops_invalid,
                                 conntrack_be_liberal=setup.conntrack_be_liberal)
        (state.state_dir / pod.name).mkdir(exist_ok=True)
        istio_proxy.prepare_container_log(processes.log_path(state, f"{pod.name}/sidecar"))
        if pod.certs:
            pki.pod_certificates(state.state_dir / "pki", Path(pod.certs), spiffe_id(state.namespace))
            # the SNI its callers' sidecars send (an ISTIO_MUTUAL cluster's), which the scenario's mTLS caller sends
            (Path(pod.certs) / "server-name").write_text(
                f"outbound_.{HTTP_PORT}_._.{service_host(pod.name, state.namespace)}")
        for role, argv, env in _pod_processes(pod, state, envoy):
            state = processes.spawn(state, f"{pod.name}/{role}", netns.in_netns(pod.netns, *argv), env=env)
            roles_of.setdefault(pod.name, []).append(role)
            if role == "sidecar" and fix.holds_application:  # pilot-agent wait: the apps after Envoy's listeners
                processes.wait_for(state, f"pod {pod.name}'s sidecar", ready_timeout,
                                   lambda pod=pod: {INBOUND_CAPTURE_PORT, ADMIN_PORT}
                                   <= netns.listening_ports(pod.netns),
                                   watch=[f"{pod.name}/sidecar"])
        if state.mesh.caller_sidecar:
            state = _start_caller(state, pod, envoy, in_mesh=lab_fixes.injected(setup.labels))
    for pod in state.pods:
        if f"{pod.name}/caller" in state.pids:
            processes.wait_for(state, f"pod {pod.name}'s caller sidecar", ready_timeout,
                               lambda pod=pod: {OUTBOUND_PORT, ADMIN_PORT} <= netns.listening_ports(pod.client_netns),
                               watch=[f"{pod.name}/caller"])
        roles = roles_of[pod.name]
        wanted = ({ECHO_PORT} | ({INBOUND_CAPTURE_PORT, OUTBOUND_PORT, ADMIN_PORT} if "sidecar" in roles else set())
                  | ({HTTP_PORT} if "app-http" in roles else set()))
        processes.wait_for(state, f"pod {pod.name} (ports {sorted(wanted)})", ready_timeout,
                           lambda pod=pod, wanted=wanted: wanted <= netns.listening_ports(pod.netns),
                           watch=[f"{pod.name}/{role}" for role in roles])
    if drivers:
        for pod in state.pods:
            argv = netns.in_netns(pod.client_netns, *_driver_args(pod, pod.scenario, rounds=rounds,
                                                                  seconds=seconds, period=period))
            state = processes.spawn(state, f"{pod.name}/scenario", argv)
    if apiserver:
        state = processes.spawn(state, "apiserver", [
            sys.executable, "-m", "meshdoctor_lab.apiserver",
            "--state", str(state.state_dir / "state.json"), "--kubeconfig", str(state.kubeconfig),
            "--host", "127.0.0.1", "--port", "0",
        ])
        processes.wait_for(state, "test API server (kubeconfig)", ready_timeout, state.kubeconfig.exists,
                           watch=["apiserver"])
    return state


# Istio's protocol prefixes of port names that are not HTTP (pkg/config/protocol/instance.go Parse)
_TCP_PREFIXES = ("tcp", "tls", "https", "mongo", "redis", "mysql")


def port_kind(name: str) -> str:
    """"http", "tcp" or "auto": how Istio treats a container port by its name's protocol prefix (`http`,
    `http-web`, `http2`, `grpc` ... are HTTP; `tcp`, `tls`, `mysql` ... TCP; a name without a known prefix
    is sniffed: protocol detection, on by default for outbound)."""
    prefix = name.split("-", 1)[0]  # `grpc-web` is `grpc` here
    if prefix in ("http", "http2", "grpc"):
        return "http"
    return "tcp" if prefix in _TCP_PREFIXES else "auto"


def inbound_kind(name: str) -> str:
    """The pod's own sidecar renders a sniffed port as TCP: through a caller sidecar its inbound side reads the
    protocol from the mTLS ALPN, not by sniffing (the lab does not render inbound sniffing)."""
    kind = port_kind(name)
    return "tcp" if kind == "auto" else kind


def _pod_processes(pod: LabPod, state: LabState,
                   envoy: str) -> list[tuple[str, list[str], dict[str, str] | None]]:
    """(role, argv, environment to add) of the processes in a scenario's pod namespace; SETUPS holds the knobs,
    state.mesh the mesh-wide settings. Envoy's environment holds its private key, when it has one."""
    fix, setup = _pod_setup(pod, state)
    sidecar = setup.sidecar
    apps = [sys.executable, "-m", "meshdoctor_lab.apps"]
    app_processes: list[tuple[str, list[str], dict[str, str] | None]] = []
    if setup.app_http is not None:
        app_processes.append(("app-http", [*apps, setup.app_kind, "--port", str(HTTP_PORT), *setup.app_http], None))
    app_processes.append(("app-tcp", [*apps, setup.tcp_app, "--port", str(ECHO_PORT)], None))
    if not lab_fixes.injected(setup.labels):
        return app_processes
    issued = pki.workload(Path(pod.certs), spiffe_id(state.namespace)) if pod.certs else None
    config = bootstrap_text(BootstrapPod(pod.name, state.namespace, pod.pod_ip,
                                         tuple((p.port, inbound_kind(p.name)) for p in pod.ports),
                                         issued.identity() if issued else None), sidecar)
    sidecar_process = ("sidecar", istio_proxy.envoy_argv(envoy, config, tproxy=fix.interception == "TPROXY"),
                       {pki.KEY_ENV: issued.key.read_text()} if issued else None)
    return ([sidecar_process, *app_processes] if fix.holds_application
            else [*app_processes, sidecar_process])


def start_caller_sidecar(state: LabState, pod: str) -> LabState:
    """(Re)start pod ``pod``'s caller sidecar as the kubelet starts its container: pilot-agent's work before
    Envoy (the workload certificate, the bootstrap), then Envoy. Raises LabError, KeyError (no such pod)."""
    lab_pod = state.pod(pod)
    _, setup = _pod_setup(lab_pod, state)
    return _start_caller(state, lab_pod, istio_proxy.envoy_binary(), in_mesh=lab_fixes.injected(setup.labels))


def _start_caller(state: LabState, pod: LabPod, envoy: str, in_mesh: bool) -> LabState:
    """istio-init's outbound rules in the pod's client namespace and the caller sidecar (uid 1337) there;
    ``in_mesh``: the pod has a sidecar, so its endpoint is labelled for mTLS (else the caller sends plaintext)."""
    netns.install_caller_rules(pod.client_netns)
    istio_proxy.prepare_container_log(processes.log_path(state, f"{pod.name}/caller"))
    _, setup = _pod_setup(pod, state, as_caller=True)
    issued = pki.caller(Path(pod.certs), spiffe_id(state.namespace))
    caller = CallerPod(caller_pod_name(pod.name), state.namespace, pod.client_ip, pod.name, pod.pod_ip,
                       tuple((p.port, port_kind(p.name)) for p in pod.ports), issued.identity(),
                       retry_503=state.mesh.caller_retry_503, target_in_mesh=in_mesh)
    argv = istio_proxy.envoy_argv(envoy, caller_bootstrap_text(caller, setup.sidecar))
    return processes.spawn(state, f"{pod.name}/caller", netns.in_netns(pod.client_netns, *argv),
                           env={pki.KEY_ENV: issued.key.read_text()})


def _driver_args(pod: LabPod, scenario: str, *, rounds: int, seconds: float, period: float) -> list[str]:
    return [
        sys.executable, "-m", "meshdoctor_lab.scenarios", scenario,
        "--pod-ip", pod.pod_ip, "--client-ip", pod.client_ip, "--pod-netns", pod.netns, "--pod-name", pod.name,
        "--rounds", str(rounds), "--seconds", str(seconds), "--period", str(period),
        *(["--fix", pod.fix] if pod.fix else []),
        *(["--certs", pod.certs] if pod.certs else []),
        *(["--caller", pod.caller, "--client-netns", pod.client_netns] if pod.caller else []),
    ]


def access_log_path(state: LabState, pod: str) -> Path:
    """The pod's sidecar access log (Istio TEXT format), as `kubectl logs <pod> -c istio-proxy` shows it."""
    return state.state_dir / pod / "istio-proxy.log"


def caller_log_path(state: LabState, pod: str) -> Path:
    """The log of the pod's caller sidecar (`lab up --caller sidecar`): its access log and Envoy's own log, as
    `kubectl logs POD-caller -c istio-proxy` shows them."""
    return processes.log_path(state, f"{pod}/caller")


