"""The lab API server's container statuses and kubelet events, from the runs the lab records (state.json
``started`` and ``ended``): what kubectl and the product read of a restart."""

from __future__ import annotations

import json

from meshdoctor_lab.apiserver.container_status import ContainerRuns, ProcessRuns, container_events, container_status
from meshdoctor_lab.state import EndedRun

T0 = 1_796_000_000.0


def test_a_container_never_ended_runs_from_its_start_with_no_restart_or_event_of_an_end():
    st = container_status("uid", "istio-proxy", "img:1", ContainerRuns(T0 + 5), T0)
    assert (st["restartCount"], st["lastState"], st["ready"]) == (0, {}, True)
    assert st["state"] == {"running": {"startedAt": "2026-11-30T00:53:25Z"}}
    assert [r for _, r, _ in container_events(ContainerRuns(T0 + 5), "istio-proxy", T0)] == ["Created", "Started"]


def test_a_crash_then_a_restart_is_one_restart_with_the_killed_run_as_last_state():
    crashed = EndedRun(T0, T0 + 60, 137)
    runs = ContainerRuns(T0 + 61, (crashed,))
    st = container_status("uid", "istio-proxy", "img:1", runs, T0)
    assert st["restartCount"] == 1 and st["state"]["running"]["startedAt"] == "2026-11-30T00:54:21Z"
    assert st["lastState"]["terminated"] | {"containerID": ""} == {
        "containerID": "", "exitCode": 137, "reason": "Error", "startedAt": "2026-11-30T00:53:20Z",
        "finishedAt": "2026-11-30T00:54:20Z"}
    assert st["containerID"] != st["lastState"]["terminated"]["containerID"]  # each run its own container
    reasons = [(ts - T0, r) for ts, r, _ in container_events(runs, "istio-proxy", T0)]
    assert reasons == [(0, "Created"), (0, "Started"), (61, "Created"), (61, "Started")]  # a crash: no Killing


def test_a_container_down_now_is_terminated_not_ready_and_a_stop_is_the_kubelets_killing():
    stopped = EndedRun(T0, T0 + 60, 0, asked=T0 + 55)
    runs = ContainerRuns(T0, (stopped,))  # ended, not started again: `started` still holds the ended run's
    st = container_status("uid", "app", "img:1", runs, T0)
    assert not runs.running and (st["ready"], st["started"], st["lastState"]) == (False, False, {})
    assert st["state"]["terminated"]["reason"] == "Completed" and st["restartCount"] == 1
    assert ("Killing", "Stopping container app") in [(r, m) for _, r, m in container_events(runs, "app", T0)]


def test_the_state_file_is_read_again_when_it_changes_and_a_caller_sidecar_is_its_pods_istio_proxy(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"started": {"p/caller": T0, "p/sidecar": T0 + 1}}))
    runs = ProcessRuns(path)
    assert runs.of("p-caller", "istio-proxy") == ContainerRuns(T0)
    assert runs.of("p", "istio-proxy") == ContainerRuns(T0 + 1) and runs.of("p", "app") == ContainerRuns()
    path.write_text(json.dumps({"started": {"p/caller": T0 + 70},
                                "ended": {"p/caller": [{"started": T0, "finished": T0 + 60, "exit_code": 137}]}}))
    assert runs.of("p-caller", "istio-proxy") == ContainerRuns(T0 + 70, (EndedRun(T0, T0 + 60, 137),))
