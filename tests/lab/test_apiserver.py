"""The lab's test API server, driven by the official `kubernetes` client (no mocks).

Each module run creates a throwaway network namespace and a hand-written state file, starts the server as a
subprocess (`python -m kubectl_meshdoctor.lab.apiserver`) and talks to it through the kubeconfig it writes.
Needs root and iproute2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.stream import portforward, stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDIN_CHANNEL, WSClient
from websocket import WebSocketConnectionClosedException

from kubectl_meshdoctor.lab.apiserver.kubeconfig import admin_call

from ..waiting import wait_until as _wait_until

pytestmark = pytest.mark.lab

POD = "collision"
NAMESPACE = "meshdoctor-lab"




def _netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True).stdout
    return [int(p) for p in out.split()]


def _procs_in_netns(ns: str, argv: list[str]) -> list[int]:
    """Pids in `ns` whose command line is exactly `argv`."""
    found = []
    for pid in _netns_pids(ns):
        try:
            if psutil.Process(pid).cmdline() == argv:
                found.append(pid)
        except psutil.Error:
            pass
    return found


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    kubeconfig: Path
    netns: str
    state_dir: Path
    api: client.CoreV1Api
    apps: client.AppsV1Api
    authz: client.AuthorizationV1Api
    api_client: client.ApiClient
    stderr_path: Path

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """Call the lab admin endpoints with the kubeconfig's server, token and CA."""
        return admin_call(self.kubeconfig, method, path, body)

    def set_faults(self, faults: dict[str, Any]) -> None:
        self.admin("POST", "/_lab/faults", faults)

    def clear_faults(self) -> None:
        self.admin("DELETE", "/_lab/faults")


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab API server runs commands in network namespaces: needs root")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2")


def _start_server(tmp: Path, netns: str, *extra: str) -> Server:
    state_dir = tmp / "state"
    state_dir.mkdir(parents=True)
    state = {
        "name": "meshdoctor-lab", "namespace": NAMESPACE, "state_dir": str(state_dir), "kubeconfig": "unused",
        "pods": [{"name": POD, "scenario": "collision", "netns": netns, "client_netns": netns + "-c",
                  "pod_ip": "198.18.1.2", "client_ip": "198.18.1.1",
                  "ports": [{"name": "http", "port": 5000}, {"name": "tcp-echo", "port": 5002}],
                  "uid": str(uuid.uuid4()), "some_future_key": True}],
        "pids": {},
    }
    (state_dir / "state.json").write_text(json.dumps(state))
    kubeconfig = tmp / "kubeconfig"
    stderr_path = tmp / "apiserver.log"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubectl_meshdoctor.lab.apiserver", "--state", str(state_dir / "state.json"),
             "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", "0", *extra],
            stdout=subprocess.DEVNULL, stderr=err)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"apiserver exited {proc.returncode}: {stderr_path.read_text()}")
        return kubeconfig.exists()

    _wait_until("kubeconfig written", 20, ready)
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    api_client = client.ApiClient(cfg)
    return Server(proc, kubeconfig, netns, state_dir, client.CoreV1Api(api_client), client.AppsV1Api(api_client),
                  client.AuthorizationV1Api(api_client), api_client, stderr_path)


def _stop_server(server: Server) -> list[int]:
    """SIGTERM the server and return the pids of its descendants that are still alive afterwards."""
    try:
        descendants = psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    server.proc.send_signal(signal.SIGTERM)
    rc = server.proc.wait(timeout=20)
    assert rc == 0, server.stderr_path.read_text()[-3000:]
    alive = []
    for p in descendants:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except psutil.Error:
            pass
    return alive


@pytest.fixture(scope="module")
def netns_name() -> Iterator[str]:
    _require_root()
    name = f"mdtest-api-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        for pid in _netns_pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture(scope="module")
def server(netns_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start_server(tmp_path_factory.mktemp("apiserver"), netns_name)
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            left = _stop_server(srv)
            assert not left, f"processes the server started are still alive: {left}"
            assert _netns_pids(netns_name) == [], "processes left in the pod netns"
        print("\n--- apiserver log (tail) ---\n" + "\n".join(srv.stderr_path.read_text().splitlines()[-15:]))


@pytest.fixture(autouse=True)
def _no_faults(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").clear_faults()


def _add_ephemeral(server: Server, name: str, command: list[str] | None, json_patch: bool = False) -> Any:
    container = {"name": name, "image": "nicolaka/netshoot:v0.13", "targetContainerName": "istio-proxy",
                 "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}}}
    if command is not None:
        container["command"] = command
    body: Any
    if json_patch:
        pod = server.api.read_namespaced_pod(POD, NAMESPACE)
        path = "/spec/ephemeralContainers/-" if pod.spec.ephemeral_containers else "/spec/ephemeralContainers"
        body = [{"op": "add", "path": path, "value": container if path.endswith("-") else [container]}]
    else:
        body = {"spec": {"ephemeralContainers": [container]}}
    return server.api.patch_namespaced_pod_ephemeralcontainers(POD, NAMESPACE, body)


def _ephemeral_state(server: Server, name: str) -> Any:
    pod = server.api.read_namespaced_pod(POD, NAMESPACE)
    for st in pod.status.ephemeral_container_statuses or []:
        if st.name == name:
            return st.state
    return None


def _wait_running(server: Server, name: str) -> Any:
    return _wait_until(f"{name} running", 10,
                       lambda: (s := _ephemeral_state(server, name)) is not None and s.running is not None and s)


def _exec(server: Server, command: list[str], container: str = "app", **kw: Any) -> WSClient:
    return stream(server.api.connect_get_namespaced_pod_exec, POD, NAMESPACE, command=command, container=container,
                  stdin=kw.pop("stdin", False), stdout=True, stderr=True, tty=False, _preload_content=False, **kw)


# ------------------------------------------------------------------------------------------------ objects


def test_read_pod_has_the_istio_sidecar_shape(server: Server) -> None:
    pod = server.api.read_namespaced_pod(POD, NAMESPACE)
    assert pod.kind == "Pod" and pod.metadata.name == POD and pod.metadata.namespace == NAMESPACE
    assert pod.metadata.labels["app"] == POD and pod.metadata.labels["version"] == "v1"
    assert pod.metadata.annotations["kubectl.kubernetes.io/default-container"] == "app"
    assert json.loads(pod.metadata.annotations["sidecar.istio.io/status"])["containers"] == ["istio-proxy"]
    assert [c.name for c in pod.spec.containers] == ["app", "istio-proxy"]
    app, proxy = pod.spec.containers
    assert [(p.name, p.container_port) for p in app.ports] == [("http", 5000), ("tcp-echo", 5002)]
    assert proxy.image == "docker.io/istio/proxyv2:1.26.2"
    assert proxy.ports[0].container_port == 15090 and proxy.ports[0].name == "http-envoy-prom"
    assert proxy.readiness_probe.http_get.port == 15021
    init = pod.spec.init_containers[0]
    assert init.name == "istio-init" and init.args[init.args.index("-d") + 1] == "15090,15021,15020"
    assert pod.spec.node_name == "lab-node"
    assert pod.status.phase == "Running" and pod.status.pod_ip == "198.18.1.2" and pod.status.host_ip
    assert all(s.ready and s.state.running for s in pod.status.container_statuses)


def test_list_by_label_and_deployment(server: Server) -> None:
    assert [p.metadata.name for p in server.api.list_namespaced_pod(NAMESPACE, label_selector=f"app={POD}").items] \
        == [POD]
    assert server.api.list_namespaced_pod(NAMESPACE, label_selector="app=other").items == []
    assert server.api.list_namespaced_pod("elsewhere").items == []
    deploy = server.apps.read_namespaced_deployment(POD, NAMESPACE)
    assert deploy.spec.selector.match_labels == {"app": POD}
    selector = ",".join(f"{k}={v}" for k, v in deploy.spec.selector.match_labels.items())
    assert len(server.api.list_namespaced_pod(NAMESPACE, label_selector=selector).items) == 1


def test_missing_pod_is_404_with_real_status(server: Server) -> None:
    with pytest.raises(client.ApiException) as err:
        server.api.read_namespaced_pod("nope", NAMESPACE)
    assert err.value.status == 404
    body = json.loads(err.value.body)
    assert body["message"] == 'pods "nope" not found'
    assert body["reason"] == "NotFound" and body["details"] == {"name": "nope", "kind": "pods"}


def test_bad_token_is_401(server: Server, tmp_path: Path) -> None:
    kc = yaml.safe_load(server.kubeconfig.read_text())
    kc["users"][0]["user"]["token"] = "wrong"
    (tmp_path / "kc").write_text(yaml.safe_dump(kc))
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(tmp_path / "kc"), client_configuration=cfg)
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(client.ApiClient(cfg)).read_namespaced_pod(POD, NAMESPACE)
    assert err.value.status == 401
    assert json.loads(err.value.body)["reason"] == "Unauthorized"


def test_kubeconfig_shape(server: Server) -> None:
    kc = yaml.safe_load(server.kubeconfig.read_text())
    assert kc["current-context"] == "meshdoctor-lab"
    ctx = kc["contexts"][0]
    assert ctx["name"] == "meshdoctor-lab" and ctx["context"]["namespace"] == NAMESPACE
    # HTTPS by default, trusting the CA the server made for this run: kubectl sends no token over plain HTTP.
    assert kc["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
    assert kc["clusters"][0]["cluster"]["certificate-authority-data"]
    assert kc["users"][0]["user"]["token"]
    assert server.kubeconfig.stat().st_mode & 0o077 == 0


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


def test_ssar_allows_and_denies(server: Server) -> None:
    def review(verb: str, sub: str) -> bool:
        body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace=NAMESPACE, verb=verb, resource="pods",
                                                           subresource=sub)))
        return server.authz.create_self_subject_access_review(body).status.allowed

    assert review("create", "exec") and review("patch", "ephemeralcontainers")
    server.set_faults({"deny": [{"verb": "create", "resource": "pods", "subresource": "exec"}]})
    assert not review("create", "exec")
    assert review("patch", "ephemeralcontainers")
    with pytest.raises(client.ApiException) as err:  # the denial also applies to the request itself
        _exec(server, ["true"])
    assert err.value.status == 0 and "403" in err.value.reason


# ------------------------------------------------------------------------------------------------ exec


def test_exec_streams_and_exit_code(server: Server) -> None:
    ws = _exec(server, ["sh", "-c", "echo hi; echo oops >&2; exit 3"])
    ws.run_forever(timeout=10)
    assert ws.subprotocol == "v5.channel.k8s.io"
    assert ws.read_stdout() == "hi\n" and ws.read_stderr() == "oops\n"
    assert ws.returncode == 3


def test_exec_success_status(server: Server) -> None:
    out = stream(server.api.connect_get_namespaced_pod_exec, POD, NAMESPACE, command=["ip", "-o", "link"],
                 container="istio-proxy", stdin=False, stdout=True, stderr=True, tty=False)
    assert "lo:" in out


def test_exec_binary_bytes_pass_unchanged(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "sent.bin"
    ws = _exec(server, ["sh", "-c", f"head -c 3000000 /dev/urandom | tee {target}"], binary=True)
    received = bytearray()
    deadline = time.monotonic() + 30
    while ws.is_open() and time.monotonic() < deadline:
        ws.update(timeout=1)
        received += ws.read_stdout(timeout=0)
    assert not ws.is_open()
    assert ws.returncode == 0
    sent = target.read_bytes()
    assert len(received) == len(sent) == 3_000_000
    assert hashlib.sha256(received).hexdigest() == hashlib.sha256(sent).hexdigest()


def test_exec_stdin_close_ends_cat(server: Server) -> None:
    ws = _exec(server, ["cat"], stdin=True, binary=True)
    ws.write_stdin(b"hello \x00\xff\n")
    ws.close_channel(STDIN_CHANNEL)
    ws.run_forever(timeout=10)
    assert ws.read_stdout() == b"hello \x00\xff\n"
    assert ws.returncode == 0


def test_exec_in_ephemeral_container_and_bad_containers(server: Server) -> None:
    _add_ephemeral(server, "dbg-exec", ["sleep", "306"])
    _wait_running(server, "dbg-exec")
    ws = _exec(server, ["echo", "from-debug"], container="dbg-exec")
    ws.run_forever(timeout=10)
    assert ws.read_stdout() == "from-debug\n" and ws.returncode == 0
    with pytest.raises(client.ApiException) as err:
        _exec(server, ["true"], container="nope")
    assert err.value.status == 0 and "400" in err.value.reason
    # A container that is not running answers with a Failure Status on the error channel.
    _add_ephemeral(server, "dbg-gone", ["true"])
    _wait_until("dbg-gone terminated", 10, lambda: (s := _ephemeral_state(server, "dbg-gone")) and s.terminated)
    ws = _exec(server, ["true"], container="dbg-gone")
    ws.run_forever(timeout=10)
    status = json.loads(ws.read_channel(ERROR_CHANNEL))
    assert status["status"] == "Failure" and status["reason"] == "NotFound"


def test_capture_whose_exec_fails_in_the_stream_says_why(server: Server) -> None:
    """tcpdump's exec is refused inside the stream (a Failure Status without an exit code, as for a container
    that is not running): the capture says why instead of ending as if nothing had been asked."""
    from kubectl_meshdoctor.kube.capture import ExecCapture
    from kubectl_meshdoctor.kube.client import Kube

    _add_ephemeral(server, "dbg-ended", ["true"])
    _wait_until("dbg-ended terminated", 10, lambda: (s := _ephemeral_state(server, "dbg-ended")) and s.terminated)
    read_fd, write_fd = os.pipe()
    cap = ExecCapture(Kube(server.api_client, NAMESPACE, "lab", 10.0), NAMESPACE, POD, "dbg-ended", "lo", 5,
                      write_fd)
    cap.start()
    assert cap.join(20)
    assert os.read(read_fd, 1) == b""  # tshark would see the end of its input
    os.close(read_fd)
    assert cap.listening.is_set() and cap.returncode is None
    assert cap.error == 'capture stream on lo: container not found ("dbg-ended")'


def test_exec_backpressure_blocks_the_process(server: Server) -> None:
    size = 32 << 20
    ws = _exec(server, ["head", "-c", str(size), "/dev/zero"], binary=True)
    pid = _wait_until("head in the pod netns", 5,
                      lambda: _procs_in_netns(server.netns, ["head", "-c", str(size), "/dev/zero"]))[0]

    def written() -> int:
        return psutil.Process(pid).io_counters().write_chars

    # While we read nothing, head must stall (its pipe is full) long before it has written everything.
    last, stable_since = written(), time.monotonic()
    deadline = time.monotonic() + 15
    while time.monotonic() - stable_since < 0.5:
        assert time.monotonic() < deadline, "head never blocked: the server buffers without bound"
        time.sleep(0.05)
        now = written()
        if now != last:
            last, stable_since = now, time.monotonic()
    assert psutil.Process(pid).is_running() and last < size // 2
    received = 0
    deadline = time.monotonic() + 60
    while ws.is_open() and time.monotonic() < deadline:
        ws.update(timeout=1)
        received += len(ws.read_stdout(timeout=0))
    assert received == size and ws.returncode == 0


def test_exec_drop_fault_cuts_the_stream(server: Server) -> None:
    server.set_faults({"exec": {"drop_after_bytes": 100_000, "times": 1}})
    ws = _exec(server, ["head", "-c", "1000000", "/dev/zero"], binary=True)
    received, lost = 0, False
    deadline = time.monotonic() + 10
    while ws.is_open() and time.monotonic() < deadline:
        try:
            ws.update(timeout=1)
        except (WebSocketConnectionClosedException, ConnectionError):
            lost = True
        # Frames read before the cut are buffered even when the same update() then hit the closed socket.
        buffered = ws._channels.pop(1, b"")  # the client's channel buffer: read_stdout would poll the dead socket
        received += len(buffered)
        if lost:
            break
    assert received == 100_000
    assert lost or ws.peek_channel(ERROR_CHANNEL) == b""  # no exit status: the stream was lost
    # The next exec is not affected (times: 1).
    assert stream(server.api.connect_get_namespaced_pod_exec, POD, NAMESPACE, command=["echo", "ok"],
                  container="app", stdin=False, stdout=True, stderr=True, tty=False) == "ok\n"


# ------------------------------------------------------------------------------------------------ logs, watch, pf


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


def test_portforward_reaches_localhost_in_the_pod(server: Server) -> None:
    port = 15099
    echo = subprocess.Popen(
        ["ip", "netns", "exec", server.netns, sys.executable, "-c",
         "import socket\n"
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('127.0.0.1', {port})); s.listen(1); print('ready', flush=True)\n"
         "c, _ = s.accept()\n"
         "while (d := c.recv(65536)): c.sendall(d)\n"],
        stdout=subprocess.PIPE)
    try:
        assert echo.stdout is not None and echo.stdout.readline() == b"ready\n"
        pf = portforward(server.api.connect_get_namespaced_pod_portforward, POD, NAMESPACE, ports=f"{port},15098")
        sock = pf.socket(port)
        sock.settimeout(10)
        sock.sendall(b"ping \x00\xff")
        got = b""
        while len(got) < 7:
            got += sock.recv(100)
        assert got == b"ping \x00\xff"
        assert "connection refused" in _wait_until("error for the closed port", 10, lambda: pf.error(15098))
        sock.close()
        pf.close()
    finally:
        echo.kill()
        echo.wait()


def test_the_ca_is_checked_and_no_tls_serves_plain_http(server: Server, netns_name: str, tmp_path: Path) -> None:
    # Another CA (the one a second server makes) must not verify this server: the client really checks.
    other = _start_server(tmp_path / "other", netns_name)
    try:
        kc = yaml.safe_load(server.kubeconfig.read_text())
        kc["clusters"][0]["cluster"]["certificate-authority-data"] = yaml.safe_load(
            other.kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority-data"]
        (tmp_path / "kc").write_text(yaml.safe_dump(kc))
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(tmp_path / "kc"), client_configuration=cfg)
        cfg.retries = 0
        with pytest.raises(urllib3.exceptions.MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
            client.CoreV1Api(client.ApiClient(cfg)).read_namespaced_pod(POD, NAMESPACE)
    finally:
        assert _stop_server(other) == []
    plain = _start_server(tmp_path / "plain", netns_name, "--no-tls")
    try:
        kc = yaml.safe_load(plain.kubeconfig.read_text())
        assert kc["clusters"][0]["cluster"]["server"].startswith("http://127.0.0.1:")
        assert "certificate-authority-data" not in kc["clusters"][0]["cluster"]
        assert plain.api.read_namespaced_pod(POD, NAMESPACE).metadata.name == POD
        out = stream(plain.api.connect_get_namespaced_pod_exec, POD, NAMESPACE, command=["echo", "over-ws"],
                     container="app", stdin=False, stdout=True, stderr=True, tty=False)
        assert out == "over-ws\n"
    finally:
        assert _stop_server(plain) == []


# ------------------------------------------------------------------------------------------------ shutdown


def test_shutdown_ends_every_process_it_started(netns_name: str, tmp_path: Path) -> None:
    srv = _start_server(tmp_path, netns_name)
    try:
        _add_ephemeral(srv, "dbg-bye", ["sleep", "308"])
        _wait_running(srv, "dbg-bye")
        # An exec whose client stays connected and one whose client left: both must end with the server.
        live = _exec(srv, ["sleep", "309"])
        gone = _exec(srv, ["sh", "-c", "sleep 310 & sleep 311"])
        _wait_until("exec processes up", 5, lambda: _procs_in_netns(netns_name, ["sleep", "309"])
                    and _procs_in_netns(netns_name, ["sleep", "311"]))
        gone.close()
        started = [*_procs_in_netns(netns_name, ["sleep", "308"]), *_procs_in_netns(netns_name, ["sleep", "309"]),
                   *_procs_in_netns(netns_name, ["sleep", "310"]), *_procs_in_netns(netns_name, ["sleep", "311"])]
        assert len(started) == 4
    finally:
        left = _stop_server(srv)
    assert left == []
    assert not [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    live.run_forever(timeout=5)
    assert not live.is_open()
