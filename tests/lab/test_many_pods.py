"""watch over many pods at once: ten lab pods, findings tagged with the pod they came from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshdoctor_lab import lab

from .test_watch import tcpdumps_in
from .lab_names import lab_name

pytestmark = pytest.mark.lab

PODS = [f"web-{i}=collision" for i in range(1, 6)] + [f"api-{i}=healthy" for i in range(1, 6)]
# Every pod carries app=web-1, the selector of deployment web-1: one Deployment with ten replicas.
ONE_DEPLOYMENT = {p.split("=")[0]: [{"op": "replace", "path": "/metadata/labels/app", "value": "web-1"}]
                  for p in PODS}


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    name = lab_name("m")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, PODS, period=1.5, spec_patches=ONE_DEPLOYMENT)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


@pytest.mark.parametrize("target", [["deploy/web-1"], ["-l", "version=v1"]])
def test_watch_ten_pods_tags_findings_per_pod(lab_state, target):
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "watch", *target, "--kubeconfig",
                           str(lab_state.kubeconfig), "--no-tui", "--duration", "8", "-o", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    names = sorted(p.split("=")[0] for p in PODS)
    assert sorted(report["source"]["pods"]) == names
    assert {k.split("/")[0] for k in report["stats"]["interfaces"]} == set(names)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    by_pod = {f["pod"] for f in errors}
    assert by_pod and by_pod <= {n for n in names if n.startswith("web-")}, by_pod
    assert len(by_pod) >= 3  # collisions from most of the collision pods within the window
    for f in errors:
        assert f["detector"] == "tuple-collision"
        assert f["flow"]["server"] == f"{lab_state.pod(f['pod']).pod_ip}:5002"  # the finding's own pod
        assert all(e["source"].startswith(f["pod"] + "/") for e in f["evidence"])
    for pod in lab_state.pods:
        assert tcpdumps_in(pod.netns) == []
