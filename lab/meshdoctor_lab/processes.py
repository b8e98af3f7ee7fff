"""The lab's processes: started detached with their output in the container log files the test API server
serves, recorded in the state file, waited on for readiness, and stopped by the process group they lead."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import psutil

from meshdoctor_lab.state import EndedRun, LabError, LabState, caller_pod_name, write_state

_POLL = 0.05  # seconds between readiness checks
_STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
_START_TIME_SLACK = 1.0  # seconds; psutil's create_time is rounded to clock ticks


def spawn(state: LabState, key: str, argv: list[str], env: Mapping[str, str] | None = None) -> LabState:
    """Start argv detached (own session, output to state_dir/<key>.log, ``env`` added to this process's
    environment), record it, rewrite the state file."""
    with open(log_path(state, key), "ab") as log:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True,
                                    env={**os.environ, **env} if env else None)
        except OSError as exc:
            raise LabError(f"cannot start {key}: {exc.strerror or exc}") from None
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        started = time.time()
    state = replace(state, pids={**state.pids, key: proc.pid}, started={**state.started, key: started})
    write_state(state)
    return state


# Pod processes log where the test API server's log endpoint reads a container's log
# (apiserver/containers.py log_path: state_dir/<pod>/<container>.log): the apps are container `app`, Envoy
# (its own log on stderr, its access log on /dev/stdout) is `istio-proxy`.
# The caller sidecar (lab/caller_sidecar.py) is the istio-proxy of the caller pod `<pod>-caller`, which the API
# server serves beside the pod (apiserver/objects.py LabConfig.load).
_CONTAINER_OF_ROLE = {"app-http": "app", "app-tcp": "app", "sidecar": "istio-proxy"}


def log_path(state: LabState, key: str) -> Path:
    pod, _, role = key.partition("/")
    if role == "caller":
        return state.state_dir / caller_pod_name(pod) / "istio-proxy.log"
    if role in _CONTAINER_OF_ROLE:
        return state.state_dir / pod / f"{_CONTAINER_OF_ROLE[role]}.log"
    return state.state_dir / (key.replace("/", "-") + ".log")


def wait_for(
    state: LabState, what: str, timeout: float, ready: Callable[[], bool], *, watch: Sequence[str]
) -> None:
    """Poll `ready` until true; raise LabError when `timeout` seconds pass or a `watch`ed process has died."""
    deadline = time.monotonic() + timeout
    while not ready():
        for key in watch:
            if live_process(state.pids[key], state.started.get(key)) is None:
                raise LabError(f"{key} exited during lab up: {_last_line(log_path(state, key))}")
        if time.monotonic() > deadline:
            raise LabError(f"{what} not ready after {timeout:g} s (logs in {state.state_dir})")
        time.sleep(_POLL)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"


def live_process(pid: int, started: float | None) -> psutil.Process | None:
    """The process `pid` if it runs and (when `started` is known) is the one we started, else None."""
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > _START_TIME_SLACK:
            return None  # the pid was recycled: not ours
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return None
        return proc
    except psutil.NoSuchProcess:
        return None


def _reap(pid: int) -> None:
    # Our own children (when `up` ran in this process, as in tests) linger as zombies until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(pid: int, started: float | None) -> bool:
    """SIGTERM the process group of a lab process, SIGKILL after _STOP_GRACE seconds. True when it is gone."""
    return _stop(pid, started, (signal.SIGTERM, signal.SIGKILL)) is not None


def end_run(state: LabState, key: str, *, crash: bool = False) -> LabState:
    """End the process ``key`` as a container ends, and record the run in the state (``ended``) for the API
    server's restartCount, lastState and events: SIGTERM, then SIGKILL after _STOP_GRACE seconds (the kubelet's
    stop: terminationGracePeriodSeconds); ``crash``: SIGKILL at once (a crash, an OOM kill). Returns the state
    as written. Raises LabError when the process does not end, KeyError when the lab has no such process."""
    pid, started = state.pids[key], state.started.get(key)
    signals = (signal.SIGKILL,) if crash else (signal.SIGTERM, signal.SIGKILL)
    asked = None if crash else time.time()
    sig = _stop(pid, started, signals)
    if sig is None:
        raise LabError(f"{key} (pid {pid}) did not end")
    # A process already gone exited on its own, its status unknown here: the kubelet's Error for a container that
    # ends unasked with a nonzero code is the likely reading, and 1 the commonest such code.
    code = 0 if sig == signal.SIGTERM else 128 + int(sig) if sig else 1
    return record_end(state, key, EndedRun(started or time.time(), time.time(), code, asked))


def record_end(state: LabState, key: str, run: EndedRun) -> LabState:
    """Add ``run`` to the runs ``key`` ended (state ``ended``) and write the state: a driver that ends a process
    its own way (pilot-agent's drain, then SIGKILL) says how the kubelet saw it end."""
    state = replace(state, ended={**state.ended, key: (*state.ended.get(key, ()), run)})
    write_state(state)
    return state


def _stop(pid: int, started: float | None, signals: tuple[signal.Signals, ...]) -> signal.Signals | int | None:
    """Send ``signals`` in turn to a lab process's group, each given _STOP_GRACE seconds: the signal after which
    it was gone (0 when it was gone before any), None when it outlived them all."""
    if live_process(pid, started) is None:
        return 0
    for sig in signals:
        try:
            # Lab processes lead their own session, so the group holds exactly what they spawned.
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return sig
        deadline = time.monotonic() + _STOP_GRACE
        while time.monotonic() < deadline:
            if live_process(pid, started) is None:
                return sig
            time.sleep(_POLL)
    return signals[-1] if live_process(pid, started) is None else None
