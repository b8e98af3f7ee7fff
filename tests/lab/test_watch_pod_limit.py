"""watch's pod limit (MAX_PODS, what bench/many proved): one pod more than it is refused in one line, exit 2,
before any pod is touched. The lab's API server serves the pods (no network namespace is needed: the refusal
comes before any exec)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.watch.live import MAX_PODS

from ..waiting import wait_until

pytestmark = pytest.mark.lab


def _serve(tmp: Path, pods: int) -> tuple[subprocess.Popen, Path]:
    """The lab's API server with ``pods`` Running pods labelled version=v1 (lab/meshdoctor_lab/apiserver)."""
    state_dir = tmp / "state"
    state_dir.mkdir(parents=True)
    state = {"name": "limit", "namespace": "limit", "state_dir": str(state_dir), "kubeconfig": "unused", "pids": {},
             "pods": [{"name": f"p{i:03d}", "scenario": "healthy", "netns": f"unused-p{i:03d}",
                       "client_netns": f"unused-p{i:03d}-c", "pod_ip": f"198.18.{i}.2", "client_ip": f"198.18.{i}.1",
                       "ports": [{"name": "http", "port": 5000}], "uid": str(uuid.uuid4())}
                      for i in range(1, pods + 1)]}
    (state_dir / "state.json").write_text(json.dumps(state))
    kubeconfig = tmp / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "meshdoctor_lab.apiserver", "--state", str(state_dir / "state.json"),
                             "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=(tmp / "apiserver.log").open("wb"))
    wait_until("kubeconfig written", 20, lambda: proc.poll() is None and kubeconfig.exists())
    return proc, kubeconfig


def test_one_pod_over_the_limit_is_refused_in_one_line(tmp_path):
    proc, kubeconfig = _serve(tmp_path, MAX_PODS + 1)
    try:
        run = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "watch", "-l", "version=v1",
                              "--kubeconfig", str(kubeconfig), "-n", "limit", "--no-tui", "--duration", "5"],
                             capture_output=True, text=True, timeout=120)
    finally:
        proc.terminate()
        proc.wait(20)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert line.endswith(f": error: {MAX_PODS + 1} pods match; watch takes at most {MAX_PODS} at once "
                         f"(narrow with -l)"), line
