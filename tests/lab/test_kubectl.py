"""The real `kubectl` against the pod lab's test API server: every verb a person uses on a lab pod.

A module lab (pod `healthy`, no drivers) is brought up with `lab.up`; each test runs the kubectl on PATH with the
lab's kubeconfig (HTTPS, the lab's CA) and asserts on what it prints. Streaming verbs run over both transports
kubectl has: WebSockets (KUBECTL_REMOTE_COMMAND_WEBSOCKETS / KUBECTL_PORT_FORWARD_WEBSOCKETS=true, kubectl >= 1.29
/ 1.30) and SPDY/3.1 (=false, and all an older kubectl such as Debian's 1.20 speaks); the API server's log says
which one served the request, and the test checks that too. Interactive sessions (`debug -it`) run kubectl on a
real pseudo-terminal. Needs root; skipped with the reason when no kubectl is on PATH.
"""

from __future__ import annotations

import calendar
import fcntl
import hashlib
import json
import os
import pty
import re
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kubectl_meshdoctor.lab import lab
from kubectl_meshdoctor.lab.apiserver.kubeconfig import admin_call

from ..waiting import wait_until

pytestmark = pytest.mark.lab

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
    name = f"mdtest-k{secrets.token_hex(2)}"
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


def _age_seconds(text: str) -> int:
    """kubectl's AGE (`42s`, `2m3s`, `5m`) in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def test_get_pods_shows_the_pod_with_its_real_age(kubectl: Kubectl) -> None:
    lab_started = min(t for k, t in kubectl.state.started.items() if k.startswith(f"{POD}/"))
    proc = kubectl.run("get", "pods")
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    name, ready, status, restarts, age = row.split()
    assert (name, ready, status, restarts) == (POD, "2/2", "Running", "0")
    elapsed = time.time() - lab_started
    assert elapsed - 3 <= _age_seconds(age) <= elapsed + 3, (age, elapsed)
    every = kubectl.run("get", "pods", "-A")
    assert every.stdout.split()[:6] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert every.stdout.splitlines()[1].split()[:2] == [kubectl.state.namespace, POD]


def test_get_pod_yaml_has_lab_times_and_an_honest_owner(kubectl: Kubectl) -> None:
    proc = kubectl.run("get", "pod", POD, "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    pod = yaml.safe_load(proc.stdout)
    meta = pod["metadata"]
    assert meta["name"] == POD and meta["namespace"] == kubectl.state.namespace
    lab_started = min(t for k, t in kubectl.state.started.items() if k.startswith(f"{POD}/"))
    created = calendar.timegm(time.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
    assert int(lab_started) == created
    # The pod keeps the lab's name, so no generateName would explain it; its ReplicaSet owns it (adoption).
    assert "generateName" not in meta
    owner = meta["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet" and owner["name"].startswith(f"{POD}-") and owner["controller"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "istio-proxy"]


def test_get_pods_watch_streams_table_rows(kubectl: Kubectl) -> None:
    proc = kubectl.popen("get", "pods", "-w")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split()[0] == "NAME"
        assert proc.stdout.readline().split()[:3] == [POD, "2/2", "Running"]
        # A change of the pod (an ephemeral container) is a MODIFIED event: kubectl prints the row again.
        _add_ephemeral(kubectl, "dbg-watch", ["sleep", "300"])
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no watch event within 30 s"
        assert proc.stdout.readline().split()[:3] == [POD, "2/2", "Running"]
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # The rows came from the server (a Table per event), not from printing Pod objects on the client.
    assert "watch pods: Table rows" in kubectl.server_log()


# ------------------------------------------------------------------------------------------------ logs


def _log_file(kubectl: Kubectl, container: str) -> Path:
    return kubectl.state.state_dir / POD / f"{container}.log"


def test_logs_and_logs_follow(kubectl: Kubectl) -> None:
    mark = secrets.token_hex(4)
    with open(_log_file(kubectl, "istio-proxy"), "a") as f:
        f.write(f"before-{mark}\n")
    proc = kubectl.run("logs", POD, "-c", "istio-proxy")
    assert proc.returncode == 0, proc.stderr
    assert f"before-{mark}\n" in proc.stdout
    follow = kubectl.popen("logs", "-f", POD, "-c", "istio-proxy", "--tail", "1")
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == f"before-{mark}\n"
        with open(_log_file(kubectl, "istio-proxy"), "a") as f:
            f.write(f"after-{mark}\n")
        ready, _, _ = select.select([follow.stdout], [], [], 30)
        assert ready and follow.stdout.readline() == f"after-{mark}\n"
        assert follow.poll() is None  # still following
    finally:
        follow.kill()
        follow.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ exec


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_runs_in_the_pod_netns_with_exit_code(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    since = len(kubectl.server_log())
    mark = secrets.token_hex(4)
    proc = kubectl.run("exec", POD, "-c", "istio-proxy", "--", "sh", "-c",
                       f"ip -o -4 addr show eth0; echo err-{mark} >&2; exit 3", websockets=websockets)
    assert proc.returncode == 3, proc.stderr
    assert f" {kubectl.state.pod(POD).pod_ip}/24 " in proc.stdout
    assert f"err-{mark}" in proc.stderr and "command terminated with exit code 3" in proc.stderr
    line = _transport(kubectl, websockets, since, f"err-{mark}")
    assert ("websocket v5.channel.k8s.io" if websockets else "SPDY/3.1 v4.channel.k8s.io") in line


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_stdin(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    data = bytes(range(256)) * 512  # 128 KiB, every byte value
    proc = subprocess.run([kubectl.path, "exec", "-i", POD, "-c", "app", "--", "sha256sum"],
                          env=kubectl.env(websockets), input=data, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_it_runs_on_a_terminal(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    term = Terminal.start([kubectl.path, "exec", "-it", POD, "-c", "app", "--", "sh"], kubectl.env(websockets))
    try:
        term.expect(b"# ")
        term.type(b"stty size; tty; exit 5\r")
        term.expect(b"/dev/pts/")
        assert b"40 120\r\n" in term.out
        assert term.wait() == 5  # the shell's exit code, through the Status on the error stream
    finally:
        term.kill()


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_drop_fault_cuts_the_stream(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    admin_call(kubectl.kubeconfig, "POST", "/_lab/faults", {"exec": {"drop_after_bytes": 100_000, "times": 1}})
    proc = subprocess.run([kubectl.path, "exec", POD, "-c", "app", "--", "head", "-c", "1000000", "/dev/zero"],
                          env=kubectl.env(websockets), capture_output=True, timeout=60)
    # The connection is cut after 100000 bytes: no more arrive (maybe fewer), and no exit status. Over
    # websockets kubectl says so; over SPDY client-go reads the bare end of the error stream as success (exit 0),
    # as it does on any lost connection.
    assert len(proc.stdout) <= 100_000
    assert proc.returncode != 0 if websockets else proc.returncode == 0
    again = kubectl.run("exec", POD, "-c", "app", "--", "echo", "ok", websockets=websockets)
    assert (again.returncode, again.stdout) == (0, "ok\n")  # `times: 1`: the next exec is whole


def test_exec_into_a_container_the_pod_lacks_says_so(kubectl: Kubectl) -> None:
    proc = kubectl.run("exec", POD, "-c", "nope", "--", "true")
    assert proc.returncode == 1
    assert "container nope is not valid for pod healthy" in proc.stderr


# ------------------------------------------------------------------------------------------------ debug, attach


def _need_debug(kubectl: Kubectl) -> None:
    if kubectl.minor < 23:
        pytest.skip(f"kubectl 1.{kubectl.minor} speaks the EphemeralContainers kind that Kubernetes 1.22 "
                    "removed; the lab serves 1.30, as a real 1.30 cluster it refuses it")


@dataclass
class Terminal:
    """kubectl on a pseudo-terminal of 40 rows x 120 columns, as a person's shell runs it."""

    pid: int
    fd: int
    out: bytes = b""

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str]) -> "Terminal":
        pid, fd = pty.fork()
        if pid == 0:  # the child: becomes kubectl, on the terminal's slave side
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)  # never run the rest of pytest in the forked child
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        return cls(pid, fd)

    def expect(self, text: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not on the terminal after {timeout} s: {self.out[-500:]!r}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # EIO: kubectl exited and closed the terminal
                    chunk = b""
                assert chunk, f"kubectl left before printing {text!r}: {self.out[-500:]!r}"
                self.out += chunk

    def type(self, text: bytes) -> None:
        os.write(self.fd, text)

    def wait(self, timeout: float = 30) -> int:
        def reaped() -> int | None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            return os.waitstatus_to_exitcode(status) if pid else None
        code = wait_until("kubectl exited", timeout, lambda: (c := reaped()) is not None and (c,))
        os.close(self.fd)
        return code[0]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_debug_runs_a_command_next_to_the_sidecar(kubectl: Kubectl) -> None:
    _need_debug(kubectl)
    name = f"dbg-cmd-{secrets.token_hex(2)}"
    proc = kubectl.run("debug", POD, "--target", "istio-proxy", "--image", IMAGE, "-c", name, "--", "sh", "-c",
                       "ip -o -4 addr show eth0")
    assert proc.returncode == 0, proc.stderr
    assert 'Targeting container "istio-proxy"' in proc.stdout + proc.stderr
    pod_ip = kubectl.state.pod(POD).pod_ip

    def logged() -> str:
        out = kubectl.run("logs", POD, "-c", name)
        return out.stdout if out.returncode == 0 and pod_ip in out.stdout else ""

    assert f" {pod_ip}/24 " in wait_until(f"{name}'s output in its log", 30, logged)


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_debug_it_gives_a_shell_on_a_terminal(kubectl: Kubectl, websockets: bool) -> None:
    _need_debug(kubectl)
    _need_websockets(kubectl, websockets, 29)
    since = len(kubectl.server_log())
    name = f"dbg-tty-{secrets.token_hex(2)}"
    term = Terminal.start([kubectl.path, "debug", POD, "--target", "istio-proxy", "--image", IMAGE, "-c", name,
                           "-it", "--", "sh"], kubectl.env(websockets))
    try:
        term.expect(b"If you don't see a command prompt, try pressing enter.")
        term.type(b"\r")
        term.expect(b"# ")
        # The window size kubectl sent (resize) is the container terminal's; the shell runs in the pod netns.
        term.type(b"stty size; ip -o -4 addr show eth0 | grep -c 198.18; echo mark-$((6*7))\r")
        term.expect(b"mark-42")
        assert b"40 120\r\n1\r\n" in term.out
        term.type(b"exit\r")
        assert term.wait() == 0
    finally:
        term.kill()
    line = _transport(kubectl, websockets, since, f"attach {POD}/{name}")
    assert ("websocket v5.channel.k8s.io" if websockets else "SPDY/3.1 v4.channel.k8s.io") in line
    def status() -> dict:
        pod = yaml.safe_load(kubectl.run("get", "pod", POD, "-o", "yaml").stdout)
        entry = next(c for c in pod["spec"]["ephemeralContainers"] if c["name"] == name)
        assert entry["targetContainerName"] == "istio-proxy" and entry["tty"] and entry["stdin"]
        return next(s for s in pod["status"]["ephemeralContainerStatuses"] if s["name"] == name)["state"]

    # `exit` ended the container's shell: the container is terminated, as a real one would be.
    assert wait_until(f"{name} terminated", 30, lambda: status().get("terminated"))["exitCode"] == 0


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_attach_joins_an_interactive_container(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    name = f"dbg-att-{secrets.token_hex(2)}"
    _add_ephemeral(kubectl, name, ["sh", "-c", "read line; echo got:$line; echo bye >&2"], stdin=True)
    since = len(kubectl.server_log())
    proc = kubectl.run("attach", POD, "-c", name, "-i", websockets=websockets, stdin=b"hello\n")
    assert proc.returncode == 0, proc.stderr
    assert "got:hello" in proc.stdout and "bye" in proc.stderr
    line = _transport(kubectl, websockets, since, f"attach {POD}/{name}")
    assert ("websocket" if websockets else "SPDY/3.1") in line


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_attach_it_to_a_tty_container(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    name = f"dbg-att-tty-{secrets.token_hex(2)}"
    _add_ephemeral(kubectl, name, ["sh"], stdin=True, tty=True)
    term = Terminal.start([kubectl.path, "attach", POD, "-c", name, "-it"], kubectl.env(websockets))
    try:
        term.expect(b"If you don't see a command prompt, try pressing enter.")
        term.type(b"\r")
        term.expect(b"# ")
        term.type(b"stty size; echo mark-$((6*7))\r")
        term.expect(b"mark-42")
        assert b"40 120\r\n" in term.out
        term.type(b"exit\r")
        assert term.wait() == 0
    finally:
        term.kill()


def test_attach_to_the_sidecar_follows_its_output(kubectl: Kubectl) -> None:
    mark = secrets.token_hex(4)
    proc = kubectl.popen("attach", POD, "-c", "istio-proxy")
    try:
        # Attach shows output from the moment it is established (the server says when), as on a node.
        wait_until("attach established", 30,
                   lambda: f"attach {POD}/istio-proxy: following its output" in kubectl.server_log())
        with open(_log_file(kubectl, "istio-proxy"), "a") as f:
            f.write(f"attached-{mark}\n")
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == f"attached-{mark}\n"
    finally:
        proc.kill()
        proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ port-forward


@pytest.fixture
def echo_in_pod(kubectl: Kubectl) -> Iterator[int]:
    """A TCP echo server on 127.0.0.1:18123 inside the pod's netns (loopback only: only a port-forward reaches it)."""
    port = 18123
    server = subprocess.Popen(
        ["ip", "netns", "exec", kubectl.state.pod(POD).netns, sys.executable, "-c",
         "import socket, threading\n"
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('127.0.0.1', {port})); s.listen(8); print('ready', flush=True)\n"
         "def echo(c):\n"
         "    while (d := c.recv(65536)): c.sendall(d)\n"
         "    c.close()\n"
         "for _ in range(8):\n"
         "    threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        yield port
    finally:
        server.kill()
        server.wait(timeout=10)


def _forwarded_port(proc: subprocess.Popen[str], remote: int) -> int:
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"kubectl port-forward ended: {proc.stderr.read() if proc.stderr else ''}"
        if m := re.match(rf"Forwarding from 127\.0\.0\.1:(\d+) -> {remote}", line):
            return int(m.group(1))
    raise AssertionError("kubectl port-forward printed no local port")


def _echo_round(port: int, payload: bytes) -> bytes:
    """Send `payload` through the forward and read until as many bytes came back or the connection ended."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(payload)
            while len(got) < len(payload):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return got


def _stderr_until(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    """Read kubectl's stderr until `text` shows (kubectl may go on running, as 1.20 does after such errors)."""
    assert proc.stderr is not None
    fd, seen = proc.stderr.fileno(), b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{text!r} not in kubectl's stderr: {seen.decode(errors='replace')}"
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"kubectl ended without saying {text!r}: {seen.decode(errors='replace')}"
            seen += chunk
    return seen.decode(errors="replace")


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_port_forward(kubectl: Kubectl, echo_in_pod: int, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 30)
    since = len(kubectl.server_log())
    with socket.socket() as probe:  # a free local port for LOCAL:REMOTE
        probe.bind(("127.0.0.1", 0))
        wanted = probe.getsockname()[1]
    proc = kubectl.popen("port-forward", f"pod/{POD}", f"{wanted}:{echo_in_pod}", websockets=websockets)
    try:
        local = _forwarded_port(proc, echo_in_pod)
        assert local == wanted
        payload = os.urandom(300_000)
        assert _echo_round(local, payload) == payload
        assert _echo_round(local, b"second connection \x00\xff") == b"second connection \x00\xff"
    finally:
        proc.kill()
        proc.wait(timeout=10)
    line = _transport(kubectl, websockets, since, "portforward ")
    assert ("websocket SPDY/3.1+portforward.k8s.io" if websockets else "SPDY/3.1 portforward.k8s.io") in line


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_port_forward_to_a_closed_port_reports_the_refusal(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 30)
    proc = kubectl.popen("port-forward", f"pod/{POD}", ":18124", websockets=websockets)
    try:
        local = _forwarded_port(proc, 18124)
        assert _echo_round(local, b"x") == b""  # kubectl closes the local connection
        _stderr_until(proc, "dial tcp4 127.0.0.1:18124: connect: connection refused")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_port_forward_drop_fault_cuts_the_connection(kubectl: Kubectl, echo_in_pod: int) -> None:
    admin_call(kubectl.kubeconfig, "POST", "/_lab/faults", {"portforward": {"drop_after_bytes": 1000}})
    proc = kubectl.popen("port-forward", f"pod/{POD}", f":{echo_in_pod}", websockets=False)
    try:
        local = _forwarded_port(proc, echo_in_pod)
        # At most the 1000 bytes pass; kubectl may lose even those (spdystream drops frames still queued when
        # the connection ends), as on a real cut.
        assert len(_echo_round(local, os.urandom(20_000))) <= 1000
        _stderr_until(proc, "lost connection to pod")
    finally:
        proc.kill()
        proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ auth


def test_auth_can_i_and_list(kubectl: Kubectl) -> None:
    # `pods/exec` on the command line would be the pod named "exec": a subresource is its own flag.
    assert kubectl.run("auth", "can-i", "create", "pods", "--subresource=exec").stdout.strip() == "yes"
    listed = kubectl.run("auth", "can-i", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split() == ["*.*", "[]", "[]", "[*]"]
    admin_call(kubectl.kubeconfig, "POST", "/_lab/faults",
               {"deny": [{"verb": "create", "resource": "pods", "subresource": "exec"}]})
    denied = kubectl.run("auth", "can-i", "create", "pods", "--subresource=exec")
    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    assert kubectl.run("auth", "can-i", "get", "pods", "--subresource=exec").stdout.strip() == "yes"
    rows = dict(re.findall(r"^(\S+)\s+\[.*?\]\s+\[.*?\]\s+(\[.*\])$",
                           kubectl.run("auth", "can-i", "--list").stdout, re.M))
    assert rows["pods/exec"] == "[get]" and rows["pods"] == "[get list watch delete]"
