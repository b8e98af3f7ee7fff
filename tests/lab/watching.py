"""Running `watch` the way the lab tests need it: start it, wait until tcpdump listens, act, stop with SIGINT."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from meshdoctor_lab.apiserver.kubeconfig import admin_call


class WatchRun:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.stderr = ""

    def stop(self, timeout: float = 60) -> dict:
        """Ctrl-C the watch (as a user would) and return its JSON report; it must exit 0 or 1."""
        self.proc.send_signal(signal.SIGINT)
        return self.report(timeout)

    def report(self, timeout: float = 60) -> dict:
        """The JSON report of a watch that was asked to stop (or ends on its own); it must exit 0 or 1."""
        stdout, self.stderr = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode in (0, 1), self.stderr
        return json.loads(stdout)


def stop_all(runs: Sequence[WatchRun], timeout: float = 60) -> list[dict]:
    """Ctrl-C every watch of ``runs`` at once, then their reports in order: each ends while the others do."""
    for run in runs:
        run.proc.send_signal(signal.SIGINT)
    return [run.report(timeout) for run in runs]


def _start(state, target: str, extra: tuple[str, ...]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "watch", *target.split(), "--kubeconfig",
                             str(state.kubeconfig), "--no-tui", "-v", "-o", "json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_capturing(proc: subprocess.Popen, target: str, deadline: float) -> None:
    """Until watch has printed "capturing" for each ``pod/NAME`` of ``target`` (once for a deployment or a
    selector)."""
    line, waiting = "", {word for word in target.split() if word.startswith("pod/")} or {""}
    while waiting:
        assert proc.poll() is None and time.monotonic() < deadline, f"watch did not start: {line}"
        line = proc.stderr.readline()
        if line.startswith("capturing"):
            waiting = {pod for pod in waiting if pod and f" in {pod} " not in line}


@contextmanager
def capturing_all(state, *watches: tuple[str, ...], ready_s: float = 60) -> Iterator[list[WatchRun]]:
    """Several watches started at once, each ``(TARGET, EXTRA...)`` as for ``capturing``, yielded once every one
    of them captures; each killed on the way out if still running. Starting them together, not one after the
    other, saves their start-ups' waits (CI's time)."""
    procs: list[subprocess.Popen] = []
    try:
        for target, *extra in watches:
            procs.append(_start(state, target, tuple(extra)))
        deadline = time.monotonic() + ready_s
        for proc, (target, *_) in zip(procs, watches):
            _wait_capturing(proc, target, deadline)
        yield [WatchRun(proc) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def capturing(state, target: str, *extra: str, ready_s: float = 60) -> Iterator[WatchRun]:
    """``watch TARGET --no-tui -v -o json EXTRA...`` against the lab, yielded once it prints "capturing" (its
    tcpdumps said "listening on") for each ``pod/NAME`` of TARGET (once for a deployment or a selector); killed
    on the way out if still running."""
    with capturing_all(state, (target, *extra), ready_s=ready_s) as (run,):
        yield run


class Faults:
    """The lab API server's fault table (POST/DELETE /_lab/faults), see lab/apiserver/faults.py."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def set(self, faults: dict) -> None:
        admin_call(self.kubeconfig, "POST", "/_lab/faults", faults)

    def clear(self) -> None:
        admin_call(self.kubeconfig, "DELETE", "/_lab/faults")
