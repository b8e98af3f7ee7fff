"""The real `kubectl` against the pod lab, the verbs that add or join a container and that forward ports:
`debug --target`, `attach`, `port-forward`, each over WebSockets and SPDY (see test_kubectl.py)."""

from __future__ import annotations

import os
import re
import secrets
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import yaml

from meshdoctor_lab.apiserver.kubeconfig import admin_call

from ..waiting import wait_until

from .kubectl_lab import (  # noqa: F401 (the fixtures are used by name)
    IMAGE,
    POD,
    TRANSPORTS,
    Kubectl,
    Terminal,
    _add_ephemeral,
    _log_file,
    _need_debug,
    _need_websockets,
    _no_faults,
    _transport,
    kubectl,
)

pytestmark = pytest.mark.lab




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
