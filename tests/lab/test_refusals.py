"""What a tool run on production pods must do when refused or killed: one clear line and exit 2, nothing
half-made left behind, and no tcpdump left in the pod even when the plugin is SIGKILLed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from meshdoctor_lab import lab

from ..waiting import wait_until
from .test_watch import stream_tsharks, tcpdumps_in
from .watching import Faults, capturing
from .lab_names import lab_name

pytestmark = pytest.mark.lab


# Pods watch must refuse, as the API serves them (RFC 6902 patches of the rendered Pod).
REFUSED_PODS = {
    "pending": [{"op": "replace", "path": "/status/phase", "value": "Pending"}],
    "windows": [{"op": "add", "path": "/spec/os", "value": {"name": "windows"}}],
    "nosidecar": [{"op": "test", "path": "/spec/containers/1/name", "value": "istio-proxy"},
                  {"op": "remove", "path": "/spec/containers/1"}],
}


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    name = lab_name("r")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name,
                   ("healthy", "healthy-http", "refused", "pending=healthy", "windows=healthy", "nosidecar=healthy"),
                   period=2.0, spec_patches=REFUSED_PODS)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


@pytest.fixture
def faults(lab_state):
    f = Faults(Path(lab_state.kubeconfig))
    yield f
    f.clear()


def watch(state, pod: str, *extra: str, seconds: str = "2") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "watch", f"pod/{pod}", "--kubeconfig",
                           str(state.kubeconfig), "--no-tui", "--duration", seconds, "-o", "json", *extra],
                          capture_output=True, text=True, timeout=120)


def ephemeral_names(state, pod: str) -> list[str]:
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(state.kubeconfig)))
    return [c.name for c in api.read_namespaced_pod(pod, state.namespace).spec.ephemeral_containers or []]


def test_missing_rbac_names_every_permission_and_a_role_before_touching_the_pod(lab_state, faults):
    faults.set({"deny": [{"verb": "patch", "resource": "pods", "subresource": "ephemeralcontainers"},
                         {"verb": "get", "resource": "pods", "subresource": "log"}]})
    proc = watch(lab_state, "healthy-http")
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "missing RBAC" in first and "patch pods/ephemeralcontainers" in first and "get pods/log" in first
    role = yaml.safe_load_all(proc.stderr.split("this Role grants them:\n", 1)[1])
    role = next(role)
    assert role["kind"] == "Role" and {"resources": ["pods/ephemeralcontainers"], "verbs": ["patch"],
                                       "apiGroups": [""]} in role["rules"]
    assert "Traceback" not in proc.stderr
    assert ephemeral_names(lab_state, "healthy-http") == []  # nothing was added


def test_missing_optional_rbac_is_a_problem_not_a_failure(lab_state, faults):
    faults.set({"deny": [{"verb": "get", "resource": "pods", "subresource": "log"}]})
    proc = watch(lab_state, "healthy")
    assert proc.returncode == 0, proc.stderr
    problems = [p["what"] for p in json.loads(proc.stdout)["problems"]]
    assert any("no permission to get pods/log" in p for p in problems), problems


def test_podsecurity_403_on_the_patch_is_one_line(lab_state, faults):
    message = ('pods "healthy-http" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities '
               '(container "meshdoctor-x" must not include "NET_RAW" in securityContext.capabilities.add)')
    faults.set({"patch_ephemeralcontainers": {"status": 403, "reason": "Forbidden", "message": message}})
    proc = watch(lab_state, "healthy-http")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "cannot add the debug container to pod/healthy-http" in line and "violates PodSecurity" in line
    assert ephemeral_names(lab_state, "healthy-http") == []


def test_image_that_cannot_be_pulled_is_one_line(lab_state, faults):
    faults.set({"ephemeral_start": {"waiting_reason": "ImagePullBackOff",
                                    "message": 'Back-off pulling image "docker.io/nicolaka/netshoot:v0.13"'}})
    proc = watch(lab_state, "healthy-http")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "cannot start: ImagePullBackOff" in line and "Back-off pulling image" in line


def test_dry_run_changes_nothing(lab_state):
    before = ephemeral_names(lab_state, "refused")
    proc = watch(lab_state, "refused", "--dry-run", "--profile", "netadmin")
    assert proc.returncode == 0
    spec = json.loads(proc.stdout.split("\n", 1)[1].split("\n# and it needs", 1)[0])
    (container,) = spec["spec"]["ephemeralContainers"]
    assert container["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW"]
    assert container["targetContainerName"] == "istio-proxy" and container["command"] == ["sleep", "3600"]
    assert "kind: Role" in proc.stdout
    assert ephemeral_names(lab_state, "refused") == before


def test_dry_run_of_a_target_the_run_would_refuse_exits_2(lab_state):
    """A typo among several pods: the plan is shown, and the run's refusal is its one-line error and exit 2."""
    proc = watch(lab_state, "refused", "pod/refsued", "--dry-run")
    assert proc.returncode == 2, proc
    (line,) = proc.stderr.strip().splitlines()
    assert 'pod "refsued" not found' in line
    assert "kind: Role" in proc.stdout


def test_dry_run_names_the_running_container_it_would_reuse(lab_state):
    """A meshdoctor-* container already runs in the pod: watch would reuse it and add nothing, and --dry-run says
    so, by its name, after a GET of the pod (it said it would add one, issue 16)."""
    first = watch(lab_state, "healthy", seconds="1")  # leaves its container running (its sleep is the TTL)
    assert first.returncode in (0, 1), first.stderr
    running = json.loads(first.stdout)["source"]["container"]
    before = ephemeral_names(lab_state, "healthy")
    assert running in before
    proc = watch(lab_state, "healthy", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == \
        f"# watch would reuse the running ephemeral container {running} in pod/healthy (nothing added)"
    assert "would add" not in proc.stdout and "ephemeralContainers" not in proc.stdout
    assert "kind: Role" in proc.stdout
    assert ephemeral_names(lab_state, "healthy") == before


def test_sigkill_mid_capture_leaves_no_tcpdump_in_the_pod(lab_state):
    """The plugin is killed without any chance to clean up: the dead-man's switch in the pod ends tcpdump."""
    pod = lab_state.pod("healthy")
    with capturing(lab_state, "pod/healthy") as run:
        assert len(tcpdumps_in(pod.netns)) == 2
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
    # The stated bound: the stream's end reaches the pod at once and tcpdump stops within 10 s.
    wait_until("tcpdump ended after the plugin's SIGKILL", 10, lambda: not tcpdumps_in(pod.netns))


def test_tshark_killed_mid_capture_is_reported_and_every_tcpdump_ends(lab_state):
    """The watch's one tshark (it dissects every stream, sources/dissector.py) is SIGKILLed, as the OOM killer
    would: the report names it for each interface, at once on stderr too, every tcpdump ends in the pod and the
    watch ends by itself with its report (nothing would analyse what it captured)."""
    pod = lab_state.pod("healthy")
    with capturing(lab_state, "pod/healthy") as run:
        (tshark,) = wait_until("the one tshark reading every stream", 30,
                               lambda: len(found := stream_tsharks(run.proc.pid)) == 1 and found)
        assert len(tcpdumps_in(pod.netns)) == 2
        tshark.kill()
        stdout, stderr = run.proc.communicate(timeout=60)
    assert run.proc.returncode in (0, 1), stderr
    killed = {p["where"]: p["what"] for p in json.loads(stdout)["problems"] if "tshark" in p["what"]}
    assert sorted(killed) == ["pod/healthy eth0", "pod/healthy lo"]
    for where, what in killed.items():
        iface = where.rsplit(" ", 1)[1]
        assert "killed by signal 9" in what and f"the rest of healthy/{iface} was not analysed" in what
        assert f"pod/healthy {iface}: tshark: killed by signal 9" in stderr  # said when it happened
    assert wait_until("no tcpdump left", 10, lambda: not tcpdumps_in(pod.netns))


def test_tshark_killed_just_before_a_ctrl_c_is_still_reported(lab_state):
    """A Ctrl-C right after a SIGKILL: the terminal's SIGINT is the stop, a SIGKILL never is."""
    with capturing(lab_state, "pod/healthy") as run:
        tsharks = wait_until("the tshark reading every stream", 30,
                             lambda: len(found := stream_tsharks(run.proc.pid)) == 1 and found)
        tsharks[0].kill()
        report = run.stop()
    assert any("tshark: killed by signal 9" in p["what"] for p in report["problems"]), report["problems"]


def test_stalled_tshark_is_killed_after_the_grace_and_named(lab_state):
    """A tshark that stops reading (SIGSTOP) must not hold the watch up for ever: after READ_GRACE_S it is
    killed, the report names it, and nothing is left running."""
    from kubectl_meshdoctor.live.run import READ_GRACE_S

    pod = lab_state.pod("healthy")
    with capturing(lab_state, "pod/healthy", "--duration", "3") as run:
        tsharks = wait_until("the tshark reading every stream", 30,
                             lambda: len(found := stream_tsharks(run.proc.pid)) == 1 and found)
        tsharks[0].suspend()
        stdout, _ = run.proc.communicate(timeout=READ_GRACE_S + 60)  # no Ctrl-C: it ends on its own
    assert run.proc.returncode in (0, 1)
    report = json.loads(stdout)
    stalled = {p["where"]: p["what"] for p in report["problems"] if "tshark still reading" in p["what"]}
    assert sorted(stalled) == ["pod/healthy eth0", "pod/healthy lo"]  # one tshark read both
    for what in stalled.values():
        assert f"{READ_GRACE_S:.0f} s after the capture was stopped: killed" in what
    assert not tsharks[0].is_running() or tsharks[0].status() == psutil.STATUS_ZOMBIE
    assert wait_until("no tcpdump left", 15, lambda: not tcpdumps_in(pod.netns))


def test_tcpdump_ended_in_the_pod_is_reported_with_how(lab_state):
    """tcpdump ends inside the pod before watch asked: by SIGTERM (exit 0, which looked like a whole capture) and
    by SIGKILL (its stderr only says it was listening). Both are named; with every stream over, watch ends."""
    pod = lab_state.pod("healthy")
    with capturing(lab_state, "pod/healthy") as run:
        by_iface = {}
        for pid in tcpdumps_in(pod.netns):
            cmdline = psutil.Process(pid).cmdline()
            by_iface[cmdline[cmdline.index("-i") + 1]] = psutil.Process(pid)
        assert sorted(by_iface) == ["eth0", "lo"]
        by_iface["eth0"].terminate()
        by_iface["lo"].kill()
        stdout, _ = run.proc.communicate(timeout=60)
    problems = {p["where"]: p["what"] for p in json.loads(stdout)["problems"]}
    assert problems["pod/healthy eth0"] == ("tcpdump on eth0 ended before the capture was stopped (exit 0); "
                                           "later packets on eth0 were not captured")
    assert problems["pod/healthy lo"] == "tcpdump on lo failed: killed by signal 9 (exit 137)"


def test_watch_that_captures_nothing_exits_2_with_its_report(lab_state):
    """No interface captured a packet (here: no such device): no finding would mean nothing, so the exit code is
    2 as for a run that could not run, and the report still says why."""
    proc = watch(lab_state, "healthy", "--iface", "nosuchdev")
    assert proc.returncode == 2, proc.stderr
    report = json.loads(proc.stdout)
    assert {"where": "pod/healthy nosuchdev", "what": "tcpdump on nosuchdev failed: tcpdump: nosuchdev: No such "
            "device exists"} in report["problems"]
    assert report["stats"]["packets"] == 0
    lo_too = watch(lab_state, "healthy", "--iface", "lo,nosuchdev", seconds="5")  # lo captured: a normal run
    assert lo_too.returncode in (0, 1) and json.loads(lo_too.stdout)["stats"]["packets"] > 0


def test_api_server_that_does_not_answer_in_time_is_one_line(lab_state, faults):
    faults.set({"get_pod": {"delay_s": 4}})  # every attempt: urllib3 retries a timed-out GET
    proc = watch(lab_state, "healthy", "--request-timeout", "1")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "cannot reach the API server" in line and "no answer within 1 s" in line


def test_api_server_error_on_the_patch_is_one_line(lab_state, faults):
    faults.set({"patch_ephemeralcontainers": {"status": 500, "message": "etcdserver: request timed out"}})
    proc = watch(lab_state, "healthy-http")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "cannot add the debug container to pod/healthy-http: etcdserver: request timed out" in line


def test_container_that_never_starts_is_one_line_after_the_start_timeout(lab_state, faults):
    faults.set({"ephemeral_start": {"delay_s": 60}})
    proc = watch(lab_state, "healthy-http", "--start-timeout", "2")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "did not start within 2 s" in line and "ContainerCreating" in line


def test_pod_deleted_mid_run_ends_the_watch_with_the_reason(lab_state):
    """The pod goes away while watch captures: the streams end, watch stops by itself and says why."""
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(lab_state.kubeconfig)))
    with capturing(lab_state, "pod/refused") as run:
        api.delete_namespaced_pod("refused", lab_state.namespace)
        report = json.loads(run.proc.communicate(timeout=60)[0])  # no Ctrl-C: it ends on its own
    # Every stream ended in an error: an error finding exits 1; else a capture that read a frame first exits 0,
    # and one that read none captured nothing, exit 2 (issue 29: never "nothing wrong" when nothing was read).
    frames = sum((c.get("frames_read") or 0) for c in report["source"]["captures"].values())
    errors = any(f["severity"] == "error" for f in report["findings"])
    assert run.proc.returncode == (1 if errors else 0 if frames else 2), (frames, errors, run.stderr)
    problems = " | ".join(p["what"] for p in report["problems"])
    assert any(what in problems for what in ("tcpdump on lo failed", "ended without an exit status",
                                             "tcpdump on lo ended before the capture was stopped")), problems
    assert wait_until("no tcpdump left", 10, lambda: not tcpdumps_in(lab_state.pod("refused").netns))



@pytest.mark.parametrize("pod, needle", [
    ("pending", "pod/pending is Pending, not Running"),
    ("windows", "pod/windows runs on a Windows node"),
    ("nosidecar", "pod/nosidecar has no istio-proxy container"),
])
def test_pods_watch_cannot_capture_are_one_line_exit_2_and_untouched(lab_state, pod, needle):
    proc = watch(lab_state, pod)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert needle in line
    assert ephemeral_names(lab_state, pod) == []


def test_sigterm_stops_the_capture_and_still_prints_the_report(lab_state):
    pod = lab_state.pod("healthy")
    with capturing(lab_state, "pod/healthy") as run:
        run.proc.send_signal(signal.SIGTERM)
        stdout, _ = run.proc.communicate(timeout=60)
    assert run.proc.returncode in (0, 1)
    assert json.loads(stdout)["source"]["pods"] == ["healthy"]
    assert wait_until("tcpdump ended after SIGTERM", 10, lambda: not tcpdumps_in(pod.netns))
