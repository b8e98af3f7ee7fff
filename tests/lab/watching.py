"""Running `watch` the way the lab tests need it: start it, wait until tcpdump listens, act, stop with SIGINT."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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
        stdout, self.stderr = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode in (0, 1), self.stderr
        return json.loads(stdout)


@contextmanager
def capturing(state, target: str, *extra: str, ready_s: float = 60) -> Iterator[WatchRun]:
    """``watch TARGET --no-tui -v -o json EXTRA...`` against the lab, yielded once it prints "capturing" (its
    tcpdumps said "listening on") for each ``pod/NAME`` of TARGET (once for a deployment or a selector); killed
    on the way out if still running."""
    pods = [word for word in target.split() if word.startswith("pod/")]
    proc = subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "watch", *target.split(), "--kubeconfig",
                             str(state.kubeconfig), "--no-tui", "-v", "-o", "json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + ready_s
        line, waiting = "", set(pods) or {""}
        while waiting:
            assert proc.poll() is None and time.monotonic() < deadline, f"watch did not start: {line}"
            line = proc.stderr.readline()
            if line.startswith("capturing"):
                waiting = {pod for pod in waiting if pod and f" in {pod} " not in line}
        yield WatchRun(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


class Faults:
    """The lab API server's fault table (POST/DELETE /_lab/faults), see lab/apiserver/faults.py."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def set(self, faults: dict) -> None:
        admin_call(self.kubeconfig, "POST", "/_lab/faults", faults)

    def clear(self) -> None:
        admin_call(self.kubeconfig, "DELETE", "/_lab/faults")
