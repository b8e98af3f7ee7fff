"""The lab's test API server through the `kubernetes` client: exec streams (exit codes, binary data, stdin,
backpressure, a cut stream) and port-forward into the pod's namespace (apiserver_lab.py starts the server)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from kubernetes import client
from kubernetes.stream import portforward, stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDIN_CHANNEL
from websocket import WebSocketConnectionClosedException

from ..waiting import wait_until as _wait_until
from .apiserver_lab import (  # noqa: F401 (the fixtures are used by name)
    NAMESPACE,
    POD,
    Server,
    _add_ephemeral,
    _ephemeral_state,
    _exec,
    _no_faults,
    _procs_in_netns,
    _wait_running,
    netns_name,
    server,
)

pytestmark = pytest.mark.lab


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
    from kubectl_meshdoctor.live.pump import ExecCapture
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

    def still_for() -> float:
        """Seconds head's write count has stood still."""
        nonlocal last, stable_since
        now = written()
        if now != last:
            last, stable_since = now, time.monotonic()
        return time.monotonic() - stable_since

    _wait_until("head blocked (its write count still for 0.5 s), not the server buffering without bound", 15,
                still_for, ok=lambda still_s: still_s >= 0.5)
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


# ------------------------------------------------------------------------------------------------ port-forward


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
