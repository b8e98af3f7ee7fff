"""`watch --envoy-debug` on the pod lab: the loggers the detectors read are at debug on the real Envoy sidecar
while the watch runs and back at their levels after it, however it ended: SIGINT, SIGTERM, --duration, SIGKILL
(the guard in the debug container puts them back), a watch that hangs (the guard's heartbeat timer), and a
SIGKILL that took the guard too (the next run puts them back). Each level is read from the proxy's own admin API
(POST /logging lists them) before, during and after; the findings carry Envoy's debug lines as evidence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.envoy_debug import read_levels
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.kube.client import KubeOptions, connect
from kubectl_meshdoctor.kube.debug import running_debug_container
from kubectl_meshdoctor.kube.envoy_guard import SILENCE_S, read_record, record_path
from meshdoctor_lab import lab

from ..waiting import wait_until
from .watching import Faults, capturing
from .lab_names import lab_name

pytestmark = pytest.mark.lab

WANTED = Pipeline.with_detectors().envoy_loggers()  # what the loaded detectors read: what must be raised


@contextmanager
def lab_up(tmp_path_factory, pods: tuple[str, ...]):
    """A lab of ``pods``; on the way out, after it is down, the guards' records it may hold: a lab's debug containers
    share this host's /tmp, and a guard the lab's end killed before it could put anything back leaves its record
    (a failed test's watch still running then)."""
    name = lab_name("l")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, pods, period=2.0)
    records = []
    try:
        kube = connect(KubeOptions(kubeconfig=str(state.kubeconfig)))
        records = [record_path(kube.core.read_namespaced_pod(p, state.namespace)) for p in pods]
        yield state
    finally:
        lab.down(state.state_dir)
        for path in records:
            Path(path).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    with lab_up(tmp_path_factory, ("stale-keepalive", "refused")) as state:
        yield state


@pytest.fixture(scope="module")
def kube(lab_state):
    return connect(KubeOptions(kubeconfig=str(lab_state.kubeconfig)))


def levels(kube, state, pod: str) -> dict[str, str]:
    """What the pod's Envoy itself lists (POST /logging through the lab's port-forward)."""
    admin = EnvoyAdmin(kube, state.namespace, pod)
    try:
        return read_levels(admin)
    finally:
        admin.close()


def raised(kube, state, pod: str) -> bool:
    now = levels(kube, state, pod)
    return all(now[n] == "debug" for n in WANTED if n in now)


def record(kube, state, pod: str):
    """The guard's record in the pod's debug container, as a later run reads it (None when there is none)."""
    p = kube.core.read_namespaced_pod(pod, state.namespace)
    container = running_debug_container(p)
    return read_record(kube, state.namespace, pod, container, record_path(p)) if container else None


def meshdoctor(state, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", *args, "--kubeconfig", str(state.kubeconfig)],
                          capture_output=True, text=True, timeout=timeout)


def check_raise(report: dict, pod: str, before: dict[str, str], by: str = "watch") -> dict:
    debug = report["envoy"]["debug"] if "debug" in report["envoy"] else report["envoy"]["per_pod"][pod]["debug"]
    assert debug["pod"] == pod and debug["wanted"] == list(WANTED)
    assert [r["logger"] for r in debug["raised"]] == [n for n in WANTED if before.get(n) not in ("debug", "trace")]
    assert all(r["from"] == before[r["logger"]] and r["to"] == "debug" and r["after"] == before[r["logger"]]
               for r in debug["raised"])
    assert debug["restored"] is True and debug["restored_by"] == by and debug["left"] == []
    assert debug["seconds"] > 0 and debug["restored_at"] > debug["raised_at"]
    return debug


def logged_since(state, pod: str, start: int, needle: str) -> int:
    """How often ``needle`` is in the pod's istio-proxy log after its first ``start`` bytes."""
    with open(lab.access_log_path(state, pod), "rb") as fh:
        fh.seek(start)
        return fh.read().decode("utf-8", "replace").count(needle)


def log_size(state, pod: str) -> int:
    return lab.access_log_path(state, pod).stat().st_size


def envoy_lines(report: dict, needle: str) -> list[dict]:
    """The findings that stand on Envoy's own log and quote a line holding ``needle``."""
    return [f for f in report["findings"] if "envoy-log" in f.get("stands_on", ())
            and any(needle in line for line in f.get("envoy_log", ()))]


def test_sigint_raises_for_the_run_then_puts_back_and_findings_quote_envoy(lab_state, kube):
    before = levels(kube, lab_state, "stale-keepalive")
    assert not raised(kube, lab_state, "stale-keepalive")
    start = log_size(lab_state, "stale-keepalive")
    with capturing(lab_state, "pod/stale-keepalive", "--envoy-debug") as run:
        assert raised(kube, lab_state, "stale-keepalive")  # during: every logger the detectors read
        assert record(kube, lab_state, "stale-keepalive").alive  # the guard holds the levels found
        others = {n: lvl for n, lvl in levels(kube, lab_state, "stale-keepalive").items() if n not in WANTED}
        assert others == {n: lvl for n, lvl in before.items() if n not in WANTED}  # exactly those
        # Two rounds told at debug (the driver's period is 2 s): the first is whole, its access-log line written.
        wait_until("stale-keepalive requests told at debug", 30,
                   lambda: logged_since(lab_state, "stale-keepalive", start, "using existing") >= 2)
        report = run.stop()
    assert levels(kube, lab_state, "stale-keepalive") == before
    assert record(kube, lab_state, "stale-keepalive") is None
    check_raise(report, "stale-keepalive", before)
    assert report["envoy"]["envoy_log_facts"] > 0 and report["envoy"]["component_log_entries"] > 0
    quoted = envoy_lines(report, "using existing")
    assert quoted, json.dumps(report["findings"], indent=1)[:3000]
    assert any("UC" in f["envoy_flags"] for f in quoted)
    assert "put back" in run.stderr  # said on stderr (the raise was said before "capturing")


def test_sigterm_puts_back_and_refused_findings_quote_the_connect_error(lab_state, kube):
    before = levels(kube, lab_state, "refused")
    start = log_size(lab_state, "refused")
    with capturing(lab_state, "pod/refused", "--envoy-debug") as run:
        assert raised(kube, lab_state, "refused")
        wait_until("refused connects told at debug", 30,
                   lambda: logged_since(lab_state, "refused", start, "delayed connect error") >= 2)
        run.proc.send_signal(signal.SIGTERM)
        stdout, run.stderr = run.proc.communicate(timeout=60)
    assert run.proc.returncode in (0, 1), run.stderr
    report = json.loads(stdout)
    assert levels(kube, lab_state, "refused") == before
    check_raise(report, "refused", before)
    quoted = envoy_lines(report, "delayed connect error")
    assert quoted and all("UF" in f["envoy_flags"] for f in quoted), json.dumps(report["findings"], indent=1)[:3000]


def test_duration_ends_it_and_text_says_it_in_one_line(lab_state, kube):
    before = levels(kube, lab_state, "refused")
    proc = meshdoctor(lab_state, "watch", "pod/refused", "--no-tui", "--duration", "4", "--envoy-debug", "-o", "text")
    assert proc.returncode in (0, 1), proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("envoy debug pod/refused: ")]
    raised_here = [n for n in WANTED if before[n] not in ("debug", "trace")]
    assert line.startswith(f"envoy debug pod/refused: {', '.join(raised_here)} warning -> debug for ")
    assert line.endswith(", put back by the watch")
    assert levels(kube, lab_state, "refused") == before


def test_sigkill_the_guard_in_the_debug_container_puts_them_back(lab_state, kube):
    before = levels(kube, lab_state, "stale-keepalive")
    with capturing(lab_state, "pod/stale-keepalive", "--envoy-debug") as run:
        assert raised(kube, lab_state, "stale-keepalive")
        run.proc.kill()  # nothing of the watch runs after this
        killed = time.monotonic()
        run.proc.wait(timeout=10)
        wait_until("the guard put the levels back", SILENCE_S + 10,
                   lambda: levels(kube, lab_state, "stale-keepalive") == before, poll_s=0.5)
    # Its stream ended with the watch: no need to wait for the heartbeat's silence.
    took = time.monotonic() - killed
    assert took < SILENCE_S, took
    assert record(kube, lab_state, "stale-keepalive") is None


def test_a_watch_that_hangs_is_timed_out_by_the_guard(lab_state, kube):
    """SIGSTOP keeps the watch's connections open and silent, as a laptop put to sleep does: the guard's
    heartbeat timer, not the end of its stream, puts the levels back."""
    before = levels(kube, lab_state, "refused")
    with capturing(lab_state, "pod/refused", "--envoy-debug") as run:
        assert raised(kube, lab_state, "refused")
        run.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            assert raised(kube, lab_state, "refused")  # the stream is still open: nothing happened yet
            wait_until("the guard's timer put the levels back", SILENCE_S + 15,
                       lambda: levels(kube, lab_state, "refused") == before, poll_s=0.5)
            assert time.monotonic() - stopped >= SILENCE_S - 6  # its silence, counted from the last heartbeat
            assert record(kube, lab_state, "refused") is None
        finally:
            run.proc.kill()
            run.proc.send_signal(signal.SIGCONT)
            run.proc.wait(timeout=10)


@pytest.mark.parametrize("next_run", ["watch", "log-level"])
def test_sigkill_with_the_guard_lost_is_put_back_by_the_next_run(lab_state, kube, next_run):
    before = levels(kube, lab_state, "stale-keepalive")
    with capturing(lab_state, "pod/stale-keepalive", "--envoy-debug") as run:
        held = record(kube, lab_state, "stale-keepalive")
        assert held.alive and raised(kube, lab_state, "stale-keepalive")
        os.kill(held.guard, signal.SIGKILL)  # the lab runs the debug container's processes as its own children
        wait_until("the guard gone", 10, lambda: not record(kube, lab_state, "stale-keepalive").alive)
        run.proc.kill()
        run.proc.wait(timeout=10)
    left = record(kube, lab_state, "stale-keepalive")
    assert left is not None and not left.alive and raised(kube, lab_state, "stale-keepalive")  # left at debug
    assert dict(left.restore) == {n: before[n] for n in WANTED if before[n] not in ("debug", "trace")}
    if next_run == "watch":
        proc = meshdoctor(lab_state, "watch", "pod/stale-keepalive", "--no-tui", "--duration", "2", "-o", "json")
        assert proc.returncode in (0, 1), proc.stderr
        report = json.loads(proc.stdout)
        found = report["envoy"]["debug"]["left_behind"]
        assert any("an earlier meshdoctor watch left" in p["what"] for p in report["problems"])
        assert found["restored"] is True and found["loggers"] == dict(left.restore)
        assert report["envoy"]["debug"]["raised"] == []  # it raised nothing of its own
    else:
        proc = meshdoctor(lab_state, "log-level", "pod/stale-keepalive")
        assert proc.returncode == 0, proc.stderr
    assert "an earlier meshdoctor watch left" in proc.stderr and "put back" in proc.stderr
    assert levels(kube, lab_state, "stale-keepalive") == before
    assert record(kube, lab_state, "stale-keepalive") is None


def test_a_second_watch_leaves_the_first_ones_raise_alone(lab_state, kube):
    before = levels(kube, lab_state, "refused")
    with capturing(lab_state, "pod/refused", "--envoy-debug") as first:
        assert raised(kube, lab_state, "refused")
        second = meshdoctor(lab_state, "watch", "pod/refused", "--no-tui", "--duration", "2", "--envoy-debug",
                            "-o", "json")
        assert second.returncode in (0, 1), second.stderr
        debug = json.loads(second.stdout)["envoy"]["debug"]
        assert debug["raised"] == [] and "holds" in debug["held_by"] and debug["error"]
        assert raised(kube, lab_state, "refused")  # the first one's raise stands until the first one ends
        report = first.stop()
    check_raise(report, "refused", before)
    assert levels(kube, lab_state, "refused") == before


def test_every_pod_of_a_selector_gets_its_own_raise(lab_state, kube):
    before = {p: levels(kube, lab_state, p) for p in ("stale-keepalive", "refused")}
    proc = meshdoctor(lab_state, "watch", "-l", "version=v1", "--no-tui", "--duration", "3", "--envoy-debug",
                      "-o", "json")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    for pod in before:
        check_raise(report, pod, before[pod])
        assert levels(kube, lab_state, pod) == before[pod]


def test_a_raise_refused_is_a_problem_line_not_a_crash(lab_state, kube):
    """No port-forward (RBAC): no admin API, nothing raised, the capture goes on, the report says why."""
    before = levels(kube, lab_state, "refused")
    faults = Faults(lab_state.kubeconfig)
    faults.set({"deny": [{"verb": "create", "resource": "pods", "subresource": "portforward"},
                         {"verb": "get", "resource": "pods", "subresource": "portforward"}]})
    try:
        proc = meshdoctor(lab_state, "watch", "pod/refused", "--no-tui", "--duration", "3", "--envoy-debug",
                          "-o", "json")
    finally:
        faults.clear()
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    debug = report["envoy"]["debug"]
    assert debug["raised"] == [] and "Envoy admin not reachable" in debug["error"]
    assert any("--envoy-debug" in p["what"] and "not reachable" in p["what"] for p in report["problems"])
    assert report["stats"]["packets"] > 0  # the capture ran all the same
    assert levels(kube, lab_state, "refused") == before
