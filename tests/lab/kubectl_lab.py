"""The lab and the kubectl runner that tests/lab/test_kubectl*.py share: a module lab (pod `healthy`, no drivers)
brought up with `lab.up`, the kubectl on PATH with the lab's kubeconfig (HTTPS, the lab's CA), both of kubectl's
streaming transports, and kubectl on a real pseudo-terminal for interactive sessions."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from meshdoctor_lab import lab
from meshdoctor_lab.apiserver.kubeconfig import admin_call

from ..waiting import wait_until
from .terminal import Terminal  # noqa: F401 (kubectl's tests import it from here)
from .lab_names import lab_name

POD = "healthy"
KUBECTL = shutil.which("kubectl")
IMAGE = "busybox:1.36"


@dataclass(frozen=True)
class Kubectl:
    """The kubectl on PATH bound to one lab; `minor` is the version that talks to this server (the
    google-cloud-sdk dispatcher picks a real kubectl by the server's /version)."""

    path: str
    kubeconfig: Path
    minor: int
    state: lab.LabState

    def env(self, websockets: bool | None = None) -> dict[str, str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.state.state_dir)}
        if websockets is not None:
            flag = "true" if websockets else "false"
            env["KUBECTL_REMOTE_COMMAND_WEBSOCKETS"] = env["KUBECTL_PORT_FORWARD_WEBSOCKETS"] = flag
        return env

    def run(self, *args: str, websockets: bool | None = None, stdin: bytes | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.path, *args], env=self.env(websockets), input=stdin, capture_output=True,
                              timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                           proc.stderr.decode(errors="replace"))

    def popen(self, *args: str, websockets: bool | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen([self.path, *args], env=self.env(websockets), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def server_log(self) -> str:
        return (self.state.state_dir / "apiserver.log").read_text()


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    if KUBECTL is None:
        pytest.skip("no kubectl on PATH (CI installs Debian's kubernetes-client when there is none)")
    name = lab_name("k")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, (POD,), drivers=False)
    try:
        version = subprocess.run([KUBECTL, "version", "-o", "json", "--kubeconfig", str(state.kubeconfig)],
                                 capture_output=True, text=True, timeout=60)
        minor = int(re.sub(r"\D", "", json.loads(version.stdout)["clientVersion"]["minor"]))
        yield Kubectl(KUBECTL, state.kubeconfig, minor, state)
    finally:
        lab.down(state.state_dir)


@pytest.fixture(autouse=True)
def _no_faults(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "kubectl" in request.fixturenames:
        admin_call(request.getfixturevalue("kubectl").kubeconfig, "DELETE", "/_lab/faults")


def _transport(kubectl: Kubectl, websockets: bool, since: int, what: str) -> str:
    """The transport line the server logged for `what` after log offset `since`."""
    lines = [line for line in kubectl.server_log()[since:].splitlines()
             if what in line and (": websocket " in line or ": SPDY/3.1 " in line)]
    assert lines, f"the server logged no {what!r}"
    return lines[-1]


def _need_websockets(kubectl: Kubectl, websockets: bool, minor: int) -> None:
    if websockets and kubectl.minor < minor:
        pytest.skip(f"kubectl 1.{kubectl.minor} has no WebSocket transport for this verb (1.{minor}+)")


TRANSPORTS = [pytest.param(True, id="websocket"), pytest.param(False, id="spdy")]


def _add_ephemeral(kubectl: Kubectl, name: str, command: list[str], stdin: bool = False, tty: bool = False) -> None:
    """Add an ephemeral container with the Python client (works whatever kubectl's version)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubectl.kubeconfig), client_configuration=cfg)
    api = client.CoreV1Api(client.ApiClient(cfg))
    api.patch_namespaced_pod_ephemeralcontainers(POD, kubectl.state.namespace, {"spec": {"ephemeralContainers": [
        {"name": name, "image": IMAGE, "command": command, "stdin": stdin, "tty": tty,
         "targetContainerName": "istio-proxy"}]}})

    def running() -> bool:
        pod = api.read_namespaced_pod(POD, kubectl.state.namespace)
        return any(st.name == name and st.state.running for st in pod.status.ephemeral_container_statuses or [])

    wait_until(f"{name} running", 30, running)


# ------------------------------------------------------------------------------------------------ get


def _log_file(kubectl: Kubectl, container: str) -> Path:
    return kubectl.state.state_dir / POD / f"{container}.log"


def _need_debug(kubectl: Kubectl) -> None:
    if kubectl.minor < 23:
        pytest.skip(f"kubectl 1.{kubectl.minor} speaks the EphemeralContainers kind that Kubernetes 1.22 "
                    "removed; the lab serves 1.30, as a real 1.30 cluster it refuses it")


