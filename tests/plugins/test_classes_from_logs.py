"""Each class Envoy logs is named from its debug log alone and from its access log alone, in every shape the
debug log is printed in. The lines are real Envoy 1.40's, recorded in the lab (tests/envoy/data/component_log/):
the same requests, so both logs must name the same class (docs/envoy-component-log.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..envoy.component_shapes import SHAPES, render_log

DATA = Path(__file__).resolve().parent.parent / "envoy" / "data" / "component_log"

# recording -> the (detector, severity) pairs its failing requests are; what Envoy's logs must be read as.
CLASSES = {
    "stale-keepalive": {("stale-keepalive", "error")},
    "refused": {("upstream-refused", "error")},
    "framing": {("http-framing", "error")},
    "slow-app": {("upstream-timeout", "error"), ("downstream-disconnect", "warning")},
    "goaway": {("upstream-goaway", "error")},
    "port-exhaustion": {("source-port-exhaustion", "error")},
    "http10": {("downstream-protocol-error", "error")},
    "downstream-idle": set(),  # the caller's retry hits this pod's RST; its sidecar logs nothing that failed
}


def analyze(lines: list[str], tmp_path: Path) -> tuple[int, dict]:
    log = tmp_path / "istio-proxy.log"
    log.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def named(report: dict) -> set[tuple[str, str]]:
    return {(f["detector"], f["severity"]) for f in report["findings"] if f["severity"] in ("error", "warning")}


@pytest.mark.parametrize("shape", ["as-recorded", *SHAPES])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_debug_log_alone_names_the_class(name, shape, tmp_path):
    lines = [ln for ln in (DATA / f"{name}.log").read_text().splitlines() if not ln.startswith("[20")]
    if shape != "as-recorded":
        lines = render_log(lines, shape)
    code, report = analyze(lines, tmp_path)
    assert named(report) == CLASSES[name], json.dumps(report["findings"], indent=1)[:2000]
    assert code == (1 if any(sev == "error" for _, sev in CLASSES[name]) else 0)
    for f in report["findings"]:
        assert f["stands_on"] == ["envoy-log"] and f["envoy_log"]
        assert all(e["kind"] == "envoy-log" and e["frame"] >= 1 for e in f["evidence"])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_access_log_alone_names_the_class(name, tmp_path):
    lines = [ln for ln in (DATA / f"{name}.log").read_text().splitlines() if ln.startswith("[20")]
    _, report = analyze(lines, tmp_path)
    # every failing request of the excerpt's access log is named (the excerpt may hold fewer kinds than its
    # debug log: a request cut at its edge)
    assert named(report) and named(report) <= CLASSES[name] or not CLASSES[name] and not named(report)
    assert all(f["stands_on"] == ["access-log"] for f in report["findings"])
