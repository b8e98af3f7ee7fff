"""A pod's shutdown as the kubelet and pilot-agent order it, with real Envoy as its sidecar: shutdown-ordering.

The mesh lab's pod (`lab up --caller sidecar`) is called by its caller pod's app through the caller's sidecar over
Istio mTLS (without a caller sidecar, by its client in plaintext: the drain's ``connection: close`` shows), every
``CALL_PERIOD_S`` for ``TRAFFIC_S`` after the pod's shutdown begins (a caller learns of the endpoint's removal only
later: EndpointSlice, istiod's push, the caller's EDS), one slow request among them that is in flight
``IN_FLIGHT_S`` before the classic sidecar's exit; with ``outbound``, the pod's app also keeps a connection out.
The pod's app keeps serving for its grace period (``APP_GRACE_S``), as an app that finishes its work on SIGTERM
does. The sidecar stops as pilot-agent stops it
(istio/istio pkg/envoy/agent.go ``terminate``, pkg/envoy/admin.go ``DrainListeners``, pkg/envoy/proxy.go ``Run``):

- SIGTERM (``classic``): ``POST /drain_listeners?inboundonly&graceful`` to Envoy's admin (Envoy started with
  ``--drain-strategy immediate``: every HTTP/1 response of an inbound listener now carries ``connection: close``,
  listeners still accept), then ``terminationDrainDuration`` (ProxyConfig, default 5 s: pkg/config/mesh/mesh.go),
  then ``cmd.Process.Kill()``: SIGKILL. The kubelet sent SIGTERM to every container at once (a classic sidecar is a
  container like the app), so the app still runs and its callers still call when Envoy is gone.
- ``EXIT_ON_ZERO_ACTIVE_CONNECTIONS`` (proxyMetadata): the same drain, ``MINIMUM_DRAIN_DURATION`` (5 s), then every
  second ``GET /stats?usedonly&filter=downstream_cx_active$`` summed over ``listener.*`` (not per worker, not
  Istio's own status listeners) until it is 0, then SIGKILL.
- ``native`` (sidecar.istio.io/nativeSidecar): the kubelet stops the app containers first and waits for them
  (KEP-753), pilot-agent having drained at once (``/drain`` -> ``drain_listeners?inboundonly&graceful&skip_exit``);
  once the app has exited the sidecar gets SIGTERM and exits at once.

Run as root against a lab: ``python -m meshdoctor_lab.shutdown STATE_DIR --pod healthy --order classic``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from meshdoctor_lab import netns, processes
from meshdoctor_lab.applied_fixes import PROXY_CONFIG
from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.startup import NATIVE_SIDECAR
from meshdoctor_lab.state import EndedRun, LabError, LabState, read_state

ORDERS = ("classic", "exit-on-zero", "drain-longer", "native")
ADMIN = "http://127.0.0.1:15000"
TERMINATION_DRAIN_S = 5.0  # ProxyConfig terminationDrainDuration's default
MINIMUM_DRAIN_S = 5.0  # pilot-agent's MINIMUM_DRAIN_DURATION default
ACTIVE_CHECK_S = 1.0  # agent.go activeConnectionCheckDelay
TRAFFIC_S = 9.0  # how long callers keep calling after the shutdown began
APP_GRACE_S = 11.0  # the app serves this long after SIGTERM (its terminationGracePeriodSeconds covers it)
CALL_PERIOD_S = 0.1
OUTBOUND_PERIOD_S = 0.2
IN_FLIGHT_S = 1.5  # the slow request starts this long before the classic sidecar's exit...
SLOW_S = 3.0  # ...and takes this long in the app
EXIT_WITHIN_S = 30.0

# The caller pod's app: a call every PERIOD s for SECONDS s, each on a connection of its own (HTTP/1.1 keep-alive:
# the answer read by its Content-Length, then the app closes), and one call of /slow/SLOW after SLOW_AT s; a line
# each: the time it started, the status or the error's errno name (else its type), the path.
_CALLER = """\
import errno, http.client, threading, time
def call(path):
    t = time.time()
    conn = http.client.HTTPConnection({host!r}, {port}, timeout=20.0)
    try:
        conn.request("GET", path, headers={{"Host": {name!r}}})
        answer = conn.getresponse()
        answer.read()
        result = str(answer.status)
    except OSError as exc:
        result = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    except http.client.HTTPException as exc:
        result = type(exc).__name__
    finally:
        conn.close()
    print(f"{{t:.6f}} {{result}} {{path}}", flush=True)
slow = threading.Timer({slow_at}, call, ("/slow/{slow}",))
slow.start()
end = time.time() + {seconds}
while time.time() < end:
    call("/")
    time.sleep({period})
slow.join()
"""


OUTBOUND_PORT = 7000  # the tcp-echo the pod's app keeps a connection to, in the client namespace (outside the pod)
# The pod's app calling out (shut_down's ``outbound``): one pooled connection to HOST:PORT (REDIRECTed to its
# sidecar's 15001), a ping every PERIOD s for SECONDS s, connecting again after an EOF or an error; a line each
# time something happens: the time, and connected, EOF or the errno's name.
_OUTBOUND = """\
import errno, socket, time
end, s = time.time() + {seconds}, None
while time.time() < end:
    try:
        if s is None:
            s = socket.create_connection(({host!r}, {port}), timeout=2.0)
            print(f"{{time.time():.6f}} connected", flush=True)
        s.sendall(b"ping\\n")
        if not s.recv(100):
            print(f"{{time.time():.6f}} EOF", flush=True)
            s.close()
            s = None
    except OSError as exc:
        print(f"{{time.time():.6f}} {{errno.errorcode.get(exc.errno or 0, type(exc).__name__)}}", flush=True)
        if s is not None:
            s.close()
        s = None
    time.sleep({period})
"""


@dataclass(frozen=True)
class Call:
    """One call of the caller pod's app: when it started (epoch seconds), its HTTP status or errno name, path."""

    ts: float
    result: str
    path: str


@dataclass(frozen=True)
class ShutdownRun:
    """What one shutdown did: the caller's calls, when it began (the kubelet's SIGTERM), when the sidecar was told
    to drain and when it was killed (epoch seconds), the app's exit (None: still running), and with ``outbound`` what
    the app's own pooled connection out went through."""

    order: str
    calls: tuple[Call, ...]
    began: float
    drained: float
    killed: float
    app_stopped: float | None
    outbound: tuple[tuple[float, str], ...] = ()  # the pod's app's own calls out: (time, connected/EOF/errno)

    def failed(self) -> tuple[Call, ...]:
        return tuple(c for c in self.calls if c.result != "200")


def order_of(annotations: Mapping[str, str]) -> tuple[str, float]:
    """The shutdown a pod template's ``annotations`` give its sidecar, as the injector renders them, and its
    terminationDrainDuration (seconds): "native" for ``sidecar.istio.io/nativeSidecar: "true"``; "exit-on-zero" for
    ``proxy.istio.io/config`` with ``proxyMetadata.EXIT_ON_ZERO_ACTIVE_CONNECTIONS: "true"``; "drain-longer" for a
    ``terminationDrainDuration`` longer than the default; else "classic". How the lab applies a fix's annotations.
    Raises LabError for a duration it cannot read."""
    if annotations.get(NATIVE_SIDECAR) == "true":
        return "native", TERMINATION_DRAIN_S
    try:
        cfg = yaml.safe_load(annotations.get(PROXY_CONFIG, "") or "{}")
    except yaml.YAMLError:
        return "classic", TERMINATION_DRAIN_S
    if not isinstance(cfg, dict):
        return "classic", TERMINATION_DRAIN_S
    if str((cfg.get("proxyMetadata") or {}).get("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "")).lower() == "true":
        return "exit-on-zero", TERMINATION_DRAIN_S
    drain = cfg.get("terminationDrainDuration")
    seconds = _seconds(str(drain)) if drain is not None else TERMINATION_DRAIN_S
    return ("drain-longer" if seconds > TERMINATION_DRAIN_S else "classic"), seconds


def _seconds(duration: str) -> float:
    """A protobuf Duration's JSON/YAML form (``"12s"``, ``"1.5s"``, ``"1m"`` as Istio's YAML accepts) in seconds."""
    text = duration.strip()
    for unit, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(unit) and text[:-len(unit)].replace(".", "", 1).isdigit():
            return float(text[:-len(unit)]) * factor
    raise LabError(f"duration {duration!r}: a number of s, ms, m or h")


def _admin(pod_ns: str, method: str, path: str) -> str:
    """Envoy admin ``method path`` in the pod's namespace (where its admin listens on 127.0.0.1), the body."""
    code = ("import sys, urllib.request; r = urllib.request.Request(sys.argv[1], method=sys.argv[2]); "
            "sys.stdout.write(urllib.request.urlopen(r, timeout=2).read().decode())")
    proc = subprocess.run(netns.in_netns(pod_ns, sys.executable, "-S", "-c", code, ADMIN + path, method),
                          capture_output=True, text=True, timeout=10, check=False)
    if proc.returncode != 0:
        raise LabError(f"Envoy admin {method} {path}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def active_connections(stats: str) -> int:
    """pilot-agent's sum over ``/stats?usedonly&filter=downstream_cx_active$`` (agent.go activeProxyConnections):
    ``listener.*`` lines only, not per worker, not Envoy's internal listeners nor Istio's status and admin ones."""
    total = 0
    for line in stats.splitlines():
        name, sep, value = line.partition(":")
        if not sep or not name.startswith("listener.") or "worker_" in name:
            continue
        if name.startswith("listener.envoy_internal_") or name.startswith("listener.admin.") or any(
                name == f"listener.0.0.0.0_{p}.downstream_cx_active" for p in (15020, 15090)):
            continue
        total += int(value.strip() or 0)
    return total


def _kill(state: LabState, key: str) -> None:
    """SIGKILL the sidecar (pilot-agent's cmd.Process.Kill()) and wait until it is gone."""
    pid = state.pids[key]
    proc = processes.live_process(pid, state.started.get(key))
    if proc is None:
        raise LabError(f"{key} is not running")
    proc.kill()
    proc.wait(timeout=EXIT_WITHIN_S)


def _stop_app(state: LabState, pod: str) -> float:
    """The kubelet's SIGTERM to the app container once its grace is over: the app's processes, stopped."""
    for role in ("app-http", "app-tcp"):
        key = f"{pod}/{role}"
        if key in state.pids:
            processes.stop(state.pids[key], state.started.get(key))
    return time.time()


def _wait_listening(ns: str, port: int) -> None:
    deadline = time.monotonic() + EXIT_WITHIN_S
    while port not in netns.listening_ports(ns):
        if time.monotonic() > deadline:
            raise LabError(f"nothing listens on {port} in {ns}")
        time.sleep(0.05)


def _wait_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.05))


def shut_down(state: LabState, pod: str, order: str = "classic", drain_s: float = TERMINATION_DRAIN_S,
              outbound: bool = False) -> ShutdownRun:
    """Shut lab pod ``pod``'s sidecar down in ``order`` (``drain_s``: terminationDrainDuration, seconds, for classic
    and drain-longer) while its caller pod's app calls it, and with ``outbound`` while the pod's app keeps a
    connection out (through its sidecar's 15001 to a tcp-echo in the client namespace); returns the run. The pod's
    sidecar is gone afterwards (and, for ``native``, its app): bring the lab down after. Raises LabError."""
    if order not in ORDERS:
        raise LabError(f"shutdown order {order!r}: one of {', '.join(ORDERS)}")
    state = read_state(state.state_dir) or state
    lab_pod = state.pod(pod)
    key = f"{pod}/sidecar"
    if key not in state.pids:
        raise LabError(f"pod {pod} has no sidecar")
    began = time.time() + 1.0  # the caller calls a second before the shutdown begins: served, pooled
    slow_at = 1.0 + TERMINATION_DRAIN_S - IN_FLIGHT_S
    script = _CALLER.format(host=lab_pod.pod_ip, port=HTTP_PORT, name=f"{pod}:{HTTP_PORT}", slow_at=slow_at,
                            slow=SLOW_S, seconds=1.0 + TRAFFIC_S, period=CALL_PERIOD_S)
    helpers: list[subprocess.Popen] = []
    if outbound:
        echo = (sys.executable, "-m", "meshdoctor_lab.apps", "tcp-echo", "--port", str(OUTBOUND_PORT))
        helpers.append(subprocess.Popen(netns.in_netns(lab_pod.client_netns, *echo),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_listening(lab_pod.client_netns, OUTBOUND_PORT)
        helpers.append(subprocess.Popen(netns.in_netns(lab_pod.netns, sys.executable, "-S", "-c", _OUTBOUND.format(
            host=lab_pod.client_ip, port=OUTBOUND_PORT, seconds=1.0 + TRAFFIC_S, period=OUTBOUND_PERIOD_S)),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    caller = subprocess.Popen(netns.in_netns(lab_pod.client_netns, sys.executable, "-S", "-c", script),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    app_stopped: float | None = None
    outbound_lines = ""
    try:
        _wait_until(began)
        if order == "native":  # the app containers first: they serve out their grace, then exit
            drained = time.time()
            _admin(lab_pod.netns, "POST", "/drain_listeners?inboundonly&graceful&skip_exit")
            _wait_until(began + APP_GRACE_S)
            app_stopped = _stop_app(state, pod)
        else:
            drained = time.time()
            _admin(lab_pod.netns, "POST", "/drain_listeners?inboundonly&graceful")
            if order == "exit-on-zero":
                _wait_until(drained + MINIMUM_DRAIN_S)
                deadline = began + EXIT_WITHIN_S
                while active_connections(_admin(lab_pod.netns, "GET",
                                                "/stats?usedonly&filter=downstream_cx_active$")) > 0:
                    if time.time() > deadline:
                        raise LabError("the sidecar's connections never reached 0")
                    time.sleep(ACTIVE_CHECK_S)
            else:
                _wait_until(drained + drain_s)
        _kill(state, key)
        killed = time.time()
        # as the kubelet saw it: asked to stop by its SIGTERM (a native sidecar's once the app had exited),
        # pilot-agent's exit 0 once it had killed Envoy (pkg/envoy/agent.go Run returns after terminate)
        state = processes.record_end(state, key, EndedRun(state.started.get(key) or began, killed, 0,
                                                          app_stopped if order == "native" else drained))
        out, _ = caller.communicate(timeout=TRAFFIC_S + SLOW_S + 60.0)
        if outbound:
            outbound_lines, _ = helpers[1].communicate(timeout=TRAFFIC_S + 60.0)
    finally:
        for proc in (caller, *helpers):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=EXIT_WITHIN_S)
    calls = tuple(Call(float(t), result, path) for t, result, path in
                  (line.split() for line in out.splitlines() if len(line.split()) == 3))
    events = tuple((float(t), what) for t, what in
                   (line.split() for line in outbound_lines.splitlines() if len(line.split()) == 2))
    return ShutdownRun(order, calls, began, drained, killed, app_stopped, events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshdoctor_lab.shutdown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("--pod", required=True)
    parser.add_argument("--order", choices=ORDERS, default="classic")
    parser.add_argument("--drain", type=float, default=TERMINATION_DRAIN_S, help="terminationDrainDuration, s")
    args = parser.parse_args(argv)
    state = read_state(args.state_dir)
    if state is None:
        print(f"shutdown: no lab in {args.state_dir}", file=sys.stderr)
        return 1
    try:
        run = shut_down(state, args.pod, args.order, args.drain)
    except LabError as exc:
        print(f"shutdown: {exc}", file=sys.stderr)
        return 1
    for c in run.calls:
        print(f"{c.ts - run.began:+7.3f} {c.result} {c.path}")
    print(f"{args.order}: {len(run.calls)} calls, {len(run.failed())} failed; drained at "
          f"{run.drained - run.began:+.3f} s, killed at {run.killed - run.began:+.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
