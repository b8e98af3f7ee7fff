"""A pod's start as the kubelet orders it, with real Envoy as its sidecar: the startup-ordering class.

The pod namespace holds istio-init's outbound rules (netns.istio_outbound_rules: every TCP connection of the app
REDIRECTed to 15001), an app that calls a server in the next namespace from the moment it starts, and the
sidecar: real Envoy with the lab's ``virtualOutbound`` listener on 15001 and PassthroughCluster (bootstrap.py).
The orders (``ORDERS``), after the kubelet (kubelet kuberuntime_manager.go SyncPod; KEP-753):

- ``classic``: containers start one after the other without waiting for any, app first (the injector appends
  istio-proxy last when nothing holds the app): the app's first calls race Envoy's start.
- ``held``: holdApplicationUntilProxyStarts: istio-proxy first, and its postStart ``pilot-agent wait`` blocks the
  next container until the proxy is ready (pilot-agent polls its readiness, which asks Envoy's admin
  ``/ready``: LIVE once the static listeners are bound).
- ``native``: istio-proxy as an init container with restartPolicy Always: the kubelet starts it and waits for its
  startupProbe (the same readiness) before the app containers.

Run as root: ``python -m meshdoctor_lab.startup OUTDIR --prefix P --order classic`` records ``lo.pcap``,
``eth0.pcap``, ``nstat.txt`` (the pod namespace's kernel counters that moved) and ``app.log`` (one line per
call: ``ok`` or the errno's name) in OUTDIR, then removes its namespaces and processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from meshdoctor_lab import istio_proxy, lab, netns, processes
from meshdoctor_lab.applied_fixes import PROXY_CONFIG, holds_application
from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.bootstrap import OUTBOUND_PORT, egress_clusters, sidecar_bootstrap, virtual_outbound
from meshdoctor_lab.captures import Interface, capturing
from meshdoctor_lab.sidecar_settings import SidecarSettings
from meshdoctor_lab.state import LabError, LabState, read_state

ORDERS = ("classic", "held", "native")
NATIVE_SIDECAR = "sidecar.istio.io/nativeSidecar"  # Istio >= 1.24: per pod, over ENABLE_NATIVE_SIDECARS
SERVER_PORT = 5000
READY_URL = "http://127.0.0.1:15000/ready"  # Envoy admin: 200 "LIVE" once initialized
READY_WITHIN_S = 20.0
POLL_S = 0.05  # pilot-agent wait polls every 500 ms; the startupProbe every second: faster here, same order
CALLS = 60
SERVED_FIRST = 5  # restart_caller_sidecar: the app's calls served before its sidecar goes down
CALL_PERIOD_S = 0.02
PROCESS_EXIT_S = 10.0


@dataclass(frozen=True)
class StartupRun:
    """What one start recorded: the app's call results in order, the kernel counters that moved, and when the
    app and the sidecar started (epoch seconds)."""

    calls: tuple[str, ...]
    counters: dict[str, int]
    app_started: float
    sidecar_started: float


# The app: COUNT connects to HOST:PORT every PERIOD s, each sending REQUEST and reading the answer to its end
# (so its close is a FIN, not a reset), one line each on stdout: ok or the errno's name, and its source port.
_APP = """\
import errno, socket, sys, time
for _ in range({count}):
    with socket.socket() as s:
        s.settimeout(5.0)
        if {bind_port}:  # a fixed port, as an app with a port pool binds it
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", {bind_port}))  # bound before connect: its port stays known when the connect fails
        try:
            s.connect(({host!r}, {port}))
            s.sendall({request!r})
            while s.recv(4096) and {read_to_end}:
                pass
            result = "ok"
        except OSError as exc:
            result = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        print(result, s.getsockname()[1], flush=True)
    time.sleep({period})
"""
ECHO_REQUEST = b"ping\n"  # the tcp-echo server answers it and stays open: one read


def app_argv(ns: str, host: str, port: int, calls: int, request: bytes = ECHO_REQUEST, bind_port: int = 0) -> list[str]:
    """The app's argv in namespace ``ns``: its loop alone (``python -S``, none of the lab's imports), so it calls
    out the moment it runs, as an app's start-up fetch does. An HTTP ``request`` with ``Connection: close`` is
    read to its end. ``bind_port``: the source port of every call (SO_REUSEADDR, as an app with a port pool
    binds); 0, the kernel's pick."""
    return netns.in_netns(ns, sys.executable, "-S", "-c", _APP.format(
        host=host, port=port, count=calls, period=CALL_PERIOD_S, request=request,
        read_to_end=request != ECHO_REQUEST, bind_port=bind_port))


def _ready() -> bool:
    try:
        with urllib.request.urlopen(READY_URL, timeout=1.0) as resp:
            return resp.status == 200
    except OSError:
        return False


def _wait_ready(pod_ns: str, alive: Callable[[], bool]) -> None:
    """Wait, as pilot-agent wait or the kubelet's startupProbe does, until Envoy reports ready. Raises LabError
    when it dies (``alive`` turns False) or READY_WITHIN_S passes."""
    deadline = time.monotonic() + READY_WITHIN_S
    probe = [sys.executable, "-S", "-c", f"import urllib.request; urllib.request.urlopen({READY_URL!r}, timeout=1)"]
    while subprocess.run(netns.in_netns(pod_ns, *probe), capture_output=True, check=False).returncode != 0:
        if not alive() or time.monotonic() > deadline:
            raise LabError("the sidecar did not become ready")
        time.sleep(POLL_S)


def _stop_caller_sidecar(state: LabState, pod: str, *, crash: bool = False) -> LabState:
    """Stop pod ``pod``'s caller sidecar (its Envoy, by its recorded pid) and wait until 15001 is free; the state as
    its file holds it now (an earlier start changed the pids). ``crash``: killed as a crash or an OOM kill ends a
    container, which the API server then counts as a restart of istio-proxy (its lastState, exit code 137);
    otherwise stopped as a pod that goes away before it is created again. Raises LabError."""
    state = read_state(state.state_dir) or state
    key = f"{pod}/caller"
    if key not in state.pids:
        raise LabError(f"pod {pod} has no caller sidecar (lab up --caller sidecar)")
    if crash:
        state = processes.end_run(state, key, crash=True)
    else:
        processes.stop(state.pids[key], state.started.get(key))
    deadline = time.monotonic() + READY_WITHIN_S
    while OUTBOUND_PORT in netns.listening_ports(state.pod(pod).client_netns):
        if time.monotonic() > deadline:
            raise LabError(f"pod {pod}'s caller sidecar did not stop")
        time.sleep(POLL_S)
    return state


def _caller_app(state: LabState, pod: str, calls: int, bind_port: int = 0) -> list[str]:
    lab_pod = state.pod(pod)
    request = f"GET / HTTP/1.1\r\nHost: {pod}:{HTTP_PORT}\r\nConnection: close\r\n\r\n".encode()
    return app_argv(lab_pod.client_netns, lab_pod.pod_ip, HTTP_PORT, calls, request, bind_port)


def reuse_port_after_crash(state: LabState, pod: str, port: int) -> tuple[LabState, tuple[tuple[str, int], ...], int]:
    """The app of pod ``pod``'s caller calls from source port ``port`` through its sidecar (``Connection: close``:
    Envoy closes first, so its accepted socket on 127.0.0.1:15001 ends in TIME-WAIT, 60 s), istio-proxy is killed
    (a crash), and the app calls again from the same port before the kubelet has started it again; then it is
    started. Returns the new state, both calls as (result, source port), and how many TIME-WAIT sockets held
    (127.0.0.1:15001, the app's port) just before the second call (``ss``). Raises LabError."""
    ns = state.pod(pod).client_netns

    def call() -> tuple[tuple[str, int], ...]:
        proc = subprocess.run(_caller_app(state, pod, 1, port), capture_output=True, text=True,
                              timeout=5.5 + PROCESS_EXIT_S, check=False)
        return _calls([line.split() for line in proc.stdout.splitlines()])

    first = call()
    state = _stop_caller_sidecar(state, pod, crash=True)
    held = netns.run(netns.in_netns(ns, "ss", "-Htn", "state", "time-wait", "src", f"127.0.0.1:{OUTBOUND_PORT}",
                                    "dport", f"= :{port}"))
    second = call()
    return lab.start_caller_sidecar(state, pod), first + second, len(held.splitlines())


def restart_caller_sidecar(state: LabState, pod: str, calls: int = CALLS) -> tuple[LabState, tuple[str, ...]]:
    """istio-proxy of pod ``pod``'s caller pod goes down while its app calls out (a crash, an OOM kill), and the
    kubelet starts it again: the app's loop runs throughout; the sidecar is stopped once the app has been served
    ``SERVED_FIRST`` times and started again once the app has been refused. Returns the new state and the app's
    call results. Raises LabError (also when the app ends before either)."""
    app = subprocess.Popen(_caller_app(state, pod, calls), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    lines: list[list[str]] = []
    try:
        assert app.stdout is not None
        for wanted, act in (("ok", lambda: _stop_caller_sidecar(state, pod, crash=True)),
                            ("ECONNREFUSED", lambda: lab.start_caller_sidecar(state, pod))):
            seen = 0
            while seen < (SERVED_FIRST if wanted == "ok" else 1):
                line = app.stdout.readline().split()
                if not line:
                    raise LabError(f"the app ended before it was {'served' if wanted == 'ok' else 'refused'}")
                lines.append(line)
                seen += line[0] == wanted
            state = act()
        # the rest through the same reader: communicate(timeout=...) reads the pipe itself and would drop what
        # readline already buffered. The app's loop is bounded (count calls, each within its timeout).
        out = app.stdout.read()
        app.wait(timeout=PROCESS_EXIT_S)
    finally:
        _stop(app)
    return state, _calls([*lines, *(line.split() for line in out.splitlines())])


def _calls(lines: list[list[str]]) -> tuple[tuple[str, int], ...]:
    """The app's lines as (result, source port)."""
    return tuple((line[0], int(line[1])) for line in lines if len(line) == 2)


def order_of(annotations: Mapping[str, str]) -> str:
    """The start order a pod template's ``annotations`` give it, as the injector renders them (istio/istio
    pkg/kube/inject): "native" for ``sidecar.istio.io/nativeSidecar: "true"`` (istio-proxy an init container with
    restartPolicy Always), "held" for ``proxy.istio.io/config`` with holdApplicationUntilProxyStarts (istio-proxy
    first, postStart ``pilot-agent wait``), else "classic". How the lab applies a fix's annotations to a start."""
    if annotations.get(NATIVE_SIDECAR) == "true":
        return "native"
    return "held" if holds_application(annotations.get(PROXY_CONFIG, "")) else "classic"


def start_caller_pod(state: LabState, pod: str, order: str, calls: int = CALLS) -> tuple[LabState, tuple[str, ...]]:
    """Start the caller pod of lab pod ``pod`` (`lab up --caller sidecar`) again in ``order``: its sidecar
    stopped, then its app (calls to the pod's HTTP port, REDIRECTed to the caller sidecar) and its sidecar
    (lab.start_caller_sidecar: pilot-agent's work, then Envoy) started as the kubelet orders them. The network
    namespace stays, as a pod's sandbox does across its containers' starts, so a watch keeps capturing it.
    Returns the new state and the app's calls as (result, source port). Raises LabError."""
    if order not in ORDERS:
        raise LabError(f"start order {order!r}: one of {', '.join(ORDERS)}")
    state = _stop_caller_sidecar(state, pod)
    argv = _caller_app(state, pod, calls)
    app: subprocess.Popen | None = None
    try:
        if order == "classic":  # in spec order without waiting: the app, then istio-proxy
            app = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            state = lab.start_caller_sidecar(state, pod)
        else:  # held (postStart pilot-agent wait) or native (startupProbe): the app once the sidecar is ready
            state = lab.start_caller_sidecar(state, pod)
            pid, started = state.pids[f"{pod}/caller"], state.started.get(f"{pod}/caller")
            _wait_ready(state.pod(pod).client_netns, lambda: processes.live_process(pid, started) is not None)
            app = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        out, _ = app.communicate(timeout=calls * (CALL_PERIOD_S + 5.5) + PROCESS_EXIT_S)
    finally:
        if app is not None:
            _stop(app)
    return state, _calls([line.split() for line in out.splitlines()])


def _nstat(pod_ns: str) -> dict[str, int]:
    out = netns.run(netns.in_netns(pod_ns, "nstat", "-a", "-z", "--json"))
    return {k: int(v) for k, v in json.loads(out).get("kernel", {}).items()}


@contextmanager
def _pod_network(prefix: str) -> Iterator[tuple[str, str, str]]:
    pod_ns, server_ns = f"{prefix}-start", f"{prefix}-start-c"
    server_ip, pod_ip = netns.pod_addresses(250)
    try:
        netns.create_pod_network(pod_ns, server_ns, pod_ip, server_ip, interception="NONE")
        netns.install_caller_rules(pod_ns)
        yield pod_ns, server_ns, server_ip
    finally:
        for ns in (pod_ns, server_ns):
            netns.delete_netns(ns)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=PROCESS_EXIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=PROCESS_EXIT_S)


def record(outdir: Path, prefix: str, order: str, calls: int = CALLS) -> StartupRun:
    """Start the pod in ``order`` and record it into ``outdir``. Raises LabError (namespaces removed)."""
    if order not in ORDERS:
        raise LabError(f"start order {order!r}: one of {', '.join(ORDERS)}")
    outdir.mkdir(parents=True, exist_ok=True)
    config = json.dumps(sidecar_bootstrap("startup", "default", "", SidecarSettings(),
                                          [virtual_outbound(SidecarSettings())], egress_clusters(), None))
    envoy_argv = istio_proxy.envoy_argv(istio_proxy.envoy_binary(), config)
    procs: list[subprocess.Popen] = []
    with _pod_network(prefix) as (pod_ns, server_ns, server_ip):
        try:
            procs.append(subprocess.Popen(netns.in_netns(server_ns, sys.executable, "-m", "meshdoctor_lab.apps",
                                                         "tcp-echo", "--port", str(SERVER_PORT)),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + READY_WITHIN_S
            while SERVER_PORT not in netns.listening_ports(server_ns):
                if time.monotonic() > deadline:
                    raise LabError("the server did not listen")
                time.sleep(POLL_S)
            before = _nstat(pod_ns)
            istio_proxy.prepare_container_log(outdir / "envoy.log")  # Envoy (uid 1337) writes /dev/stdout there
            app = app_argv(pod_ns, server_ip, SERVER_PORT, calls)
            with capturing({outdir / "lo.pcap": Interface(pod_ns, "lo"),
                            outdir / "eth0.pcap": Interface(pod_ns, "eth0")}), \
                    open(outdir / "app.log", "w") as app_log, open(outdir / "envoy.log", "a") as envoy_log:
                def start_sidecar() -> tuple[subprocess.Popen, float]:
                    p = subprocess.Popen(envoy_argv_ns, stdout=envoy_log, stderr=subprocess.STDOUT)
                    procs.append(p)
                    return p, time.time()

                def start_app() -> tuple[subprocess.Popen, float]:
                    p = subprocess.Popen(app, stdout=app_log, stderr=subprocess.STDOUT)
                    procs.append(p)
                    return p, time.time()

                envoy_argv_ns = netns.in_netns(pod_ns, *envoy_argv)
                if order == "classic":  # in spec order, without waiting: the app is first
                    app_proc, app_started = start_app()
                    envoy, sidecar_started = start_sidecar()
                else:  # held / native: the sidecar first, the app once it is ready
                    envoy, sidecar_started = start_sidecar()
                    _wait_ready(pod_ns, lambda: envoy.poll() is None)
                    app_proc, app_started = start_app()
                app_proc.wait(timeout=calls * (CALL_PERIOD_S + 2.5) + PROCESS_EXIT_S)
            after = _nstat(pod_ns)
        finally:
            for p in reversed(procs):
                _stop(p)
    moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    (outdir / "nstat.txt").write_text("".join(f"{k} {v}\n" for k, v in sorted(moved.items())))
    (outdir / "started.json").write_text(json.dumps({"app": app_started, "istio-proxy": sidecar_started}) + "\n")
    lines = tuple(r for r, _ in _calls([line.split() for line in (outdir / "app.log").read_text().splitlines()]))
    return StartupRun(lines, moved, app_started, sidecar_started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshdoctor_lab.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--prefix", required=True, help="network namespace prefix (the lab's)")
    parser.add_argument("--order", choices=ORDERS, default="classic")
    parser.add_argument("--calls", type=int, default=CALLS)
    args = parser.parse_args(argv)
    try:
        run = record(args.outdir, args.prefix, args.order, args.calls)
    except LabError as exc:
        print(f"startup: {exc}", file=sys.stderr)
        return 1
    refused = sum(1 for c in run.calls if c == "ECONNREFUSED")
    print(f"{args.order}: {len(run.calls)} calls, {refused} refused, kernel counters moved: "
          f"{ {k: v for k, v in run.counters.items() if k.startswith('Tcp')} }")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
