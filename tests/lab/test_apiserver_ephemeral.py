"""The lab's test API server through the `kubernetes` client: ephemeral containers, added by patch as `watch`
adds its capture container, run as real processes in the pod's namespace, their status, logs and watch events
(apiserver_lab.py starts the server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client, watch

from ..waiting import wait_until as _wait_until
from .apiserver_lab import (  # noqa: F401 (the fixtures are used by name)
    NAMESPACE,
    POD,
    Server,
    _add_ephemeral,
    _ephemeral_state,
    _no_faults,
    _procs_in_netns,
    _wait_running,
    netns_name,
    server,
)

pytestmark = pytest.mark.lab


# ------------------------------------------------------------------------------------------------ ephemeral


def test_strategic_merge_patch_runs_a_real_process(server: Server) -> None:
    pod = _add_ephemeral(server, "dbg-smp", ["sleep", "301"])
    entry = next(e for e in pod.spec.ephemeral_containers if e.name == "dbg-smp")
    assert entry.image_pull_policy == "IfNotPresent" and entry.termination_message_policy == "File"
    assert entry.termination_message_path == "/dev/termination-log"
    assert entry.target_container_name == "istio-proxy"
    state = _wait_running(server, "dbg-smp")
    assert state.running.started_at is not None
    assert _wait_until("sleep 301 in the pod netns", 5, lambda: _procs_in_netns(server.netns, ["sleep", "301"]))


def test_json_patch_appends_and_keeps_existing(server: Server) -> None:
    _add_ephemeral(server, "dbg-first", ["sleep", "302"])
    pod = _add_ephemeral(server, "dbg-json", ["sleep", "303"], json_patch=True)
    names = [e.name for e in pod.spec.ephemeral_containers]
    assert "dbg-first" in names and names[-1] == "dbg-json"
    _wait_running(server, "dbg-json")
    assert _wait_until("sleep 303 in the pod netns", 5, lambda: _procs_in_netns(server.netns, ["sleep", "303"]))


def test_empty_command_defaults_to_a_long_sleep(server: Server) -> None:
    _add_ephemeral(server, "dbg-nocmd", None)
    _wait_running(server, "dbg-nocmd")
    assert _wait_until("sleep 3600", 5, lambda: _procs_in_netns(server.netns, ["sleep", "3600"]))


def test_exit_is_reported_as_terminated_forever(server: Server) -> None:
    _add_ephemeral(server, "dbg-fails", ["sh", "-c", "exit 7"])
    _add_ephemeral(server, "dbg-done", ["true"])
    failed = _wait_until("dbg-fails terminated", 10,
                         lambda: (s := _ephemeral_state(server, "dbg-fails")) and s.terminated and s)
    assert failed.terminated.exit_code == 7 and failed.terminated.reason == "Error"
    assert failed.terminated.finished_at is not None
    done = _wait_until("dbg-done terminated", 10,
                       lambda: (s := _ephemeral_state(server, "dbg-done")) and s.terminated and s)
    assert done.terminated.exit_code == 0 and done.terminated.reason == "Completed"


@pytest.mark.parametrize("container, field, reason", [
    ({"name": "app", "image": "busybox:1.36"}, "spec.ephemeralContainers[{i}].name", "FieldValueDuplicate"),
    ({"name": "dbg-bad-target", "image": "busybox:1.36", "targetContainerName": "istio-prox"},
     "spec.ephemeralContainers[{i}].targetContainerName", "FieldValueNotFound"),
    ({"name": "dbg-ports", "image": "busybox:1.36", "ports": [{"containerPort": 80}]},
     "spec.ephemeralContainers[{i}].ports", "FieldValueForbidden"),
])
def test_invalid_ephemeral_is_422(server: Server, container: dict[str, Any], field: str, reason: str) -> None:
    before = server.api.read_namespaced_pod(POD, NAMESPACE).spec.ephemeral_containers or []
    with pytest.raises(client.ApiException) as err:
        server.api.patch_namespaced_pod_ephemeralcontainers(POD, NAMESPACE, {"spec": {"ephemeralContainers": [
            container]}})
    assert err.value.status == 422
    body = json.loads(err.value.body)
    assert body["reason"] == "Invalid" and body["message"].startswith(f'Pod "{POD}" is invalid: ')
    cause = body["details"]["causes"][0]
    assert cause["field"] == field.format(i=len(before)) and cause["reason"] == reason
    after = server.api.read_namespaced_pod(POD, NAMESPACE).spec.ephemeral_containers or []
    assert len(after) == len(before)


def test_duplicate_ephemeral_name_is_422(server: Server) -> None:
    _add_ephemeral(server, "dbg-dup", ["sleep", "304"])
    with pytest.raises(client.ApiException) as err:
        _add_ephemeral(server, "dbg-dup", ["sleep", "304"], json_patch=True)
    assert err.value.status == 422
    assert 'Duplicate value: "dbg-dup"' in json.loads(err.value.body)["message"]
    # The same entry again by strategic merge is a no-op (merged by name), a changed one is rejected.
    _add_ephemeral(server, "dbg-dup", ["sleep", "304"])
    with pytest.raises(client.ApiException) as err:
        _add_ephemeral(server, "dbg-dup", ["sleep", "999"])
    assert err.value.status == 422
    assert 'existing ephemeral containers "dbg-dup" may not be changed' in json.loads(err.value.body)["message"]
    assert len(_procs_in_netns(server.netns, ["sleep", "304"])) == 1


def test_patch_fault_403_surfaces_as_api_exception(server: Server) -> None:
    server.set_faults({"patch_ephemeralcontainers": {"status": 403, "message": "no debugging here"}})
    with pytest.raises(client.ApiException) as err:
        _add_ephemeral(server, "dbg-forbidden", ["sleep", "305"])
    assert err.value.status == 403
    assert json.loads(err.value.body)["message"] == "no debugging here"
    server.set_faults({"patch_ephemeralcontainers": {"status": 500, "times": 1}})
    with pytest.raises(client.ApiException) as err:
        _add_ephemeral(server, "dbg-forbidden", ["sleep", "305"])
    assert err.value.status == 500
    _add_ephemeral(server, "dbg-forbidden", ["sleep", "305"])  # `times` used up: works again


# ------------------------------------------------------------------------------------------------ logs, watch


def test_log_and_follow_of_an_ephemeral_container(server: Server) -> None:
    (server.state_dir / POD).mkdir(exist_ok=True)
    (server.state_dir / POD / "istio-proxy.log").write_text("line 1\nline 2\nline 3\n")
    assert server.api.read_namespaced_pod_log(POD, NAMESPACE, container="istio-proxy") == "line 1\nline 2\nline 3\n"
    assert server.api.read_namespaced_pod_log(POD, NAMESPACE, container="istio-proxy", tail_lines=1) == "line 3\n"
    _add_ephemeral(server, "dbg-log", ["sh", "-c", "echo one; sleep 0.3; echo two"])
    _wait_until("dbg-log started", 10, lambda: (s := _ephemeral_state(server, "dbg-log")) and not s.waiting)
    # follow ends by itself when the container has exited and its log is drained.
    assert server.api.read_namespaced_pod_log(POD, NAMESPACE, container="dbg-log", follow=True,
                                              _request_timeout=10) == "one\ntwo\n"


def test_watch_sees_ephemeral_container_start(server: Server) -> None:
    w = watch.Watch()
    added = False
    seen_running = False
    for event in w.stream(server.api.list_namespaced_pod, NAMESPACE, field_selector=f"metadata.name={POD}",
                          timeout_seconds=10):
        if event["type"] == "ADDED":
            added = True
            _add_ephemeral(server, "dbg-watch", ["sleep", "307"])
        statuses = event["object"].status.ephemeral_container_statuses or []
        if any(s.name == "dbg-watch" and s.state.running for s in statuses):
            seen_running = True
            w.stop()
    assert added and seen_running
