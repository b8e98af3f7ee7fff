"""Every lab scenario read from what a paged user can take of its sidecar, live: real Envoy 1.40 in the lab, real
kubectl against the lab's API server. For each scenario (one pod each, drivers off, rounds one after another):
Envoy's loggers raised to debug with `kubectl meshdoctor log-level`, one round, the levels put back; the pod's
istio-proxy log through `kubectl logs`, and `/stats` before and after the round through `kubectl port-forward`.

`analyze` must then name exactly the scenario's class(es) from the debug log alone (its access-log lines taken
out), from the access log alone, from both (one finding a request, standing on both logs), from the debug log
re-rendered in every shape Envoy and Istio print it, and from the `/stats` dumps, each finding saying which
evidence it stands on; the scenarios where Envoy logs no failure give no error finding. The expectations are the
ones the recordings of the same rounds are held to (tests/plugins/test_classes_from_logs.py CLASSES,
tests/commands/test_stats_alone.py SHOWN): live Envoy must be read as its recordings are.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from meshdoctor_lab import lab
from meshdoctor_lab.state import LabState

from ..envoy.component_shapes import SHAPES, render_log
from ..plugins.test_classes_from_logs import CLASSES, named
from ..commands.test_stats_alone import SHOWN, shown
from ..waiting import wait_until
from .lab_names import lab_name

pytestmark = pytest.mark.lab

SCENARIOS = tuple(sorted(CLASSES))
DATA = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40"
KUBECTL = shutil.which("kubectl")
PLUGIN_DIR = Path(sys.executable).parent  # kubectl finds `kubectl-meshdoctor` on PATH, as a user's does
# Istio's TEXT access-log line starts `[START_TIME] "`, START_TIME as %START_TIME% prints it (docs/lab-envoy.md);
# Envoy's own lines in Istio's format start with the bare timestamp and a TAB.
ACCESS_LINE = re.compile(r'^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z\] "')
DEBUG_ENTRY = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z\tdebug\tenvoy \S+ ")
ROUND_LINES_WITHIN_S = 30.0  # downstream-idle's round alone waits up to 10 s for the sidecar's FIN


@dataclass(frozen=True)
class Recording:
    """One round of a scenario as a user takes it: the istio-proxy log (`kubectl logs`, whole) and the two
    /stats dumps, as files in ``where``."""

    where: Path
    log: tuple[str, ...]

    @property
    def debug_lines(self) -> list[str]:
        return [ln for ln in self.log if not ACCESS_LINE.match(ln)]

    @property
    def access_lines(self) -> list[str]:
        return [ln for ln in self.log if ACCESS_LINE.match(ln)]


def recorded_access_lines(scenario: str) -> int:
    """How many access-log lines the recorded round of ``scenario`` has (tests/data/envoy-1.40): the live round
    is over for Envoy once its log has as many."""
    return sum(1 for ln in (DATA / scenario / "istio-proxy.log").read_text().splitlines() if ACCESS_LINE.match(ln))


class Kubectl:
    """The real kubectl with the lab's kubeconfig, and the plugin on its PATH."""

    def __init__(self, state: LabState) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(state.kubeconfig), "HOME": str(state.state_dir),
                    "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    @contextmanager
    def port_forward(self, pod: str, port: int) -> Iterator[str]:
        """``kubectl port-forward pod/POD :PORT``; yields ``http://127.0.0.1:LOCAL``. Ends the kubectl it
        started on the way out."""
        proc = subprocess.Popen([KUBECTL, "port-forward", f"pod/{pod}", f":{port}"], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        try:
            def forwarding() -> str | None:
                while not lines.empty():
                    m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) ->", lines.get())
                    if m:
                        return m.group(1)
                assert proc.poll() is None, proc.stderr.read()
                return None
            local = wait_until(f"kubectl port-forward pod/{pod} :{port}", 30, forwarding)
            yield f"http://127.0.0.1:{local}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        return resp.read().decode()


def record_round(state: LabState, kubectl: Kubectl, pod: str, where: Path) -> Recording:
    """Debug on, one round, debug off, as a user would with the plugin and kubectl (module docstring)."""
    log = lab.access_log_path(state, pod)
    with kubectl.port_forward(pod, 15000) as admin:
        (where / "stats-before.txt").write_text(get(f"{admin}/stats"))
        raised = kubectl.run("meshdoctor", "log-level", f"pod/{pod}", "--level", "debug", "-o", "json")
        assert raised.returncode == 0, raised.stderr
        assert {lvl for p in json.loads(raised.stdout)["proxies"] for lvl in p["loggers"].values()} == {"debug"}
        at = log.stat().st_size
        try:
            lab.trigger_round(state, pod)
            want = recorded_access_lines(pod)

            def round_logged() -> bool:
                with open(log, "rb") as f:
                    f.seek(at)
                    text = f.read().decode("utf-8", "replace")
                return sum(1 for ln in text.splitlines() if ACCESS_LINE.match(ln)) >= want
            wait_until(f"{want} access-log lines of {pod}'s round", ROUND_LINES_WITHIN_S, round_logged)
        finally:
            reset = kubectl.run("meshdoctor", "log-level", f"pod/{pod}", "-r", "-o", "json")
        assert reset.returncode == 0, reset.stderr
        (levels,) = [p["loggers"] for p in json.loads(reset.stdout)["proxies"]]
        assert levels.pop("misc") == "error" and set(levels.values()) == {"warning"}  # pilot-agent's levels
        (where / "stats-after.txt").write_text(get(f"{admin}/stats"))
    logs = kubectl.run("logs", pod, "-c", "istio-proxy")
    assert logs.returncode == 0, logs.stderr
    (where / "istio-proxy.log").write_text(logs.stdout)
    return Recording(where, tuple(logs.stdout.splitlines()))


@pytest.fixture(scope="module")
def debug_lab(tmp_path_factory) -> Iterator[LabState]:
    if KUBECTL is None:
        pytest.skip("no kubectl on PATH (CI installs Debian's kubernetes-client when there is none)")
    if not (PLUGIN_DIR / "kubectl-meshdoctor").exists():
        pytest.skip(f"no kubectl-meshdoctor next to {sys.executable} (pip install -e . makes it)")
    name = lab_name("t")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, SCENARIOS, drivers=False)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


@pytest.fixture(scope="module")
def recorded(debug_lab, tmp_path_factory) -> Callable[[str], Recording]:
    """The scenario's round, recorded the first time a test asks for it."""
    kubectl = Kubectl(debug_lab)
    rounds: dict[str, Recording] = {}

    def of(scenario: str) -> Recording:
        if scenario not in rounds:
            rounds[scenario] = record_round(debug_lab, kubectl, scenario, tmp_path_factory.mktemp(scenario))
        return rounds[scenario]
    return of


def analyze(*paths: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *map(str, paths), "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def analyze_lines(lines: list[str], path: Path) -> tuple[int, dict]:
    path.write_text("\n".join(lines) + "\n")
    return analyze(path)


def exit_code(expected: set[tuple[str, str]]) -> int:
    return 1 if any(sev == "error" for _, sev in expected) else 0


def show(report: dict) -> str:
    return json.dumps(report["findings"], indent=1)[:3000]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_debug_log_alone_names_the_class(recorded, scenario):
    rec = recorded(scenario)
    lines = rec.debug_lines
    assert [ln for ln in lines if DEBUG_ENTRY.match(ln)], "no debug line of Envoy in the round's log"
    code, report = analyze_lines(lines, rec.where / "debug.log")
    assert named(report) == CLASSES[scenario], show(report)
    assert code == exit_code(CLASSES[scenario])
    for f in report["findings"]:
        assert f["stands_on"] == ["envoy-log"] and f["envoy_log"], f
        assert all(e["kind"] == "envoy-log" and e["frame"] >= 1 for e in f["evidence"]), f["evidence"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_access_log_alone_names_the_class(recorded, scenario):
    rec = recorded(scenario)
    assert len(rec.access_lines) >= recorded_access_lines(scenario)
    code, report = analyze_lines(rec.access_lines, rec.where / "access.log")
    assert named(report) == CLASSES[scenario], show(report)
    assert code == exit_code(CLASSES[scenario])
    for f in report["findings"]:
        assert f["stands_on"] == ["access-log"] and f["access_log"], f


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_both_logs_name_the_class_once_a_request(recorded, scenario):
    rec = recorded(scenario)
    code, report = analyze(rec.where / "istio-proxy.log")
    assert named(report) == CLASSES[scenario], show(report)
    assert code == exit_code(CLASSES[scenario])
    entries = [e for e in map(parse_line, rec.access_lines) if e is not None]
    assert len(entries) == len(rec.access_lines)
    failing = [e.raw for e in entries if e.flags or (e.details and e.details != "via_upstream")]
    quoted = [ln for f in report["findings"] for ln in f.get("access_log", ())]
    # each failing line in exactly one finding; beside them only the round's 5xx answers a finding names as its
    # cause (the burst that made outlier detection eject: no-healthy-upstream), each once too
    assert sorted(q for q in quoted if q in failing) == sorted(failing), show(report)
    causes = [q for q in quoted if q not in failing]
    assert all(q in rec.access_lines and parse_line(q).code >= 500 for q in causes), show(report)
    assert len(set(causes)) == len(causes), show(report)
    for f in report["findings"]:
        said = [kind for kind, key in (("access-log", "access_log"), ("envoy-log", "envoy_log")) if f.get(key)]
        assert said and f["stands_on"] == said, f
    if CLASSES[scenario]:
        assert [f for f in report["findings"] if f["stands_on"] == ["access-log", "envoy-log"]], \
            "no finding joined a request's access-log line and its debug-log lines: " + show(report)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_debug_log_in_every_shape_names_the_class(recorded, scenario, shape):
    rec = recorded(scenario)
    code, report = analyze_lines(render_log(rec.debug_lines, shape), rec.where / f"debug-{shape}.log")
    assert named(report) == CLASSES[scenario], show(report)
    assert code == exit_code(CLASSES[scenario])
    assert all(f["stands_on"] == ["envoy-log"] for f in report["findings"]), show(report)


@pytest.mark.parametrize("dumps", ["one", "two"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_stats_dumps_name_the_class(recorded, scenario, dumps):
    rec = recorded(scenario)
    after = rec.where / "stats-after.txt"
    code, report = analyze(after) if dumps == "one" else analyze(rec.where / "stats-before.txt", after)
    assert shown(report) == SHOWN[scenario], show(report)
    assert code == exit_code(SHOWN[scenario])
    assert report["envoy"]["counters_since"] == ("Envoy's start" if dumps == "one" else "first dump")
    for f in report["findings"]:
        assert f["stands_on"] == ["counters"] and f["counters"], f
        assert all(e["kind"] == "counter" for e in f["evidence"]), f["evidence"]
