"""The lab's test API server as tests/lab/test_apiserver*.py drive it, with the official `kubernetes` client (no
mocks): the server, its helpers and the module fixtures they share.

Each test module creates a throwaway network namespace and a hand-written state file, starts the server as a
subprocess (`python -m meshdoctor_lab.apiserver`) and talks to it through the kubeconfig it writes.
Needs root and iproute2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
from kubernetes import client, config
from kubernetes.stream import stream
from kubernetes.stream.ws_client import WSClient

from meshdoctor_lab.apiserver.kubeconfig import admin_call

from ..waiting import wait_until as _wait_until
from .lab_names import lab_name

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
            [sys.executable, "-m", "meshdoctor_lab.apiserver", "--state", str(state_dir / "state.json"),
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
    name = lab_name("api-", 8)
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
