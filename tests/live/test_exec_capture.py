"""ExecCapture's own failures, before any API server is involved, its pump over a real websocket (aiohttp's, on a\nUnix socket), the exec target the client builds, and how exec statuses read."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import threading
import urllib.parse

import aiohttp
import pytest
from aiohttp import web
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from websocket import ABNF

from kubectl_meshdoctor.kube.client import Kube, api_error_message
from kubectl_meshdoctor.kube.exec import exec_target, exit_code_of, open_exec_ws, ssl_context_of, status_message
from kubectl_meshdoctor.live.capture_copy import copy_refusal, open_copy
from kubectl_meshdoctor.live.pump import ExecCapture

from ..waiting import wait_until_async


def test_a_copy_that_cannot_be_written_ends_the_stream_and_says_why(tmp_path):
    """--write-pcap into a place that cannot take the file: tshark sees its input end and waiters are released
    (the watch must not hang on this stream), and the reason names the file."""
    blocked = tmp_path / "pod-lo.pcap"
    blocked.mkdir()  # a directory where the file should go: open() fails, even as root
    read_fd, write_fd = os.pipe()
    cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, write_fd, tee_path=str(blocked))
    cap.start()
    assert cap.join(10)
    assert os.read(read_fd, 1) == b""
    os.close(read_fd)
    assert cap.listening.is_set() and cap.started.is_set()
    assert cap.error == f"cannot write {blocked}: Is a directory"


def test_status_message_reads_v4_json_and_v1_text():
    failure = json.dumps({"metadata": {}, "status": "Failure", "reason": "NotFound",
                          "message": 'container not found ("dbg")\nsecond line'}).encode()
    assert status_message(failure) == 'container not found ("dbg")' and exit_code_of(failure) is None
    text = b"command terminated with non-zero exit code: exit status 1"
    assert status_message(text) == text.decode()
    assert status_message(b"") == "the exec failed without a message"
    exited = json.dumps({"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "2"}]}})
    assert exit_code_of(exited.encode()) == 2


def _ended(returncode: int, stderr: str) -> str:
    cap = ExecCapture(None, "ns", "pod", "dbg", "eth0", 70, -1)
    cap.returncode, cap.stderr = returncode, stderr
    return cap._why_tcpdump_failed()


def test_why_tcpdump_failed_names_its_complaint_or_its_signal():
    listening = "tcpdump: listening on eth0, link-type EN10MB (Ethernet), snapshot length 262144 bytes\n"
    # kill -9 in the pod: only the start-up line was printed; the shell reports 128 + 9.
    assert _ended(137, listening) == "killed by signal 9 (exit 137)"
    assert _ended(1, "tcpdump: nosuchdev: No such device exists\n(No such device exists)\n") == \
        "tcpdump: nosuchdev: No such device exists"
    assert _ended(124, listening + "12 packets captured\n12 packets received by filter\n0 packets dropped by kernel\n") \
        == "stopped by its time limit of 70 s (exit 124)"
    assert _ended(2, "") == "exit code 2"


def _frame(opcode: int, data: bytes) -> bytes:
    return ABNF(1, 0, 0, 0, opcode, 0, data).format()  # as a server sends it: unmasked (websocket-client's writer)


class _ExecServer:
    """An aiohttp websocket server on a Unix socket standing in for the API server's exec stream: the test writes
    raw frame bytes onto the accepted connection (``send``), and sees what the client sent (``received``)."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.transport: asyncio.Transport | None = None
        self.connected = asyncio.Event()
        self.received: list[bytes] = []
        self.done = asyncio.Event()

    async def handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=(self.protocol,), autoclose=False)
        await ws.prepare(request)
        self.transport = request.transport
        self.connected.set()
        async for msg in ws:  # what the client sends: the stdin close of v5, its close frame
            self.received.append(msg.data if isinstance(msg.data, bytes) else b"")
        self.done.set()
        return ws

    def send(self, raw: bytes) -> None:
        assert self.transport is not None
        self.transport.write(raw)


@pytest.fixture
async def exec_stream(tmp_path):
    """(the server, the client's aiohttp websocket over a real Unix socket, an ExecCapture, the pieces it hands on),
    the v5 subprotocol agreed."""
    async with _served(tmp_path, "v5.channel.k8s.io") as parts:
        yield parts


@contextlib.asynccontextmanager
async def _served(tmp_path, protocol: str):
    server = _ExecServer(protocol)
    app = web.Application()
    app.router.add_get("/exec", server.handler)
    runner = web.AppRunner(app)
    await runner.setup()
    path = str(tmp_path / "api.sock")
    await web.UnixSite(runner, path).start()
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path))
    try:
        ws = await session.ws_connect("ws://api/exec", protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await asyncio.wait_for(server.connected.wait(), 10)
        pieces: list[bytes] = []
        cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, -1, on_data=pieces.append)
        yield server, ws, cap, pieces
        await ws.close()
    finally:
        await session.close()
        await runner.cleanup()


async def test_the_pump_hands_a_burst_on_in_one_piece_and_a_lone_frame_at_once(exec_stream):
    """Frames already waiting are read back to back and handed on together, in order; a frame that comes
    alone is handed on without waiting for more; what came before the close is handed on before the end.
    The websocket is aiohttp's over a real socket; the frames are websocket-client's (channel 1)."""
    server, ws, cap, pieces = exec_stream
    burst = [b"\x01" + b"r%03d" % i for i in range(50)]
    server.send(b"".join(_frame(ABNF.OPCODE_BINARY, f) for f in burst))
    pump = asyncio.create_task(cap._pump(ws, None))
    await wait_until_async("the burst handed on", 10, lambda: b"".join(pieces),
                           ok=lambda got: got == b"".join(f[1:] for f in burst))
    assert len(pieces) < len(burst)  # gathered: not one write a frame
    server.send(_frame(ABNF.OPCODE_BINARY, b"\x01alone"))
    # Nothing else is sent: it was not held back for company.
    await wait_until_async("the lone frame handed on", 10, lambda: pieces[-1:], ok=lambda last: last == [b"alone"])
    server.send(_frame(ABNF.OPCODE_BINARY, b"\x01last") + _frame(ABNF.OPCODE_CLOSE, b"\x03\xe8"))
    assert await asyncio.wait_for(pump, 10) == (None, "ran")
    assert pieces[-1] == b"last"


async def test_frames_read_before_a_bad_frame_are_handed_on_before_the_error(exec_stream):
    """aiohttp's reader rejects a frame the protocol forbids (here a ping longer than 125 bytes, RFC 6455
    section 5.5): the stdout frames read in the same burst still reach the stream, and the error is raised."""
    server, ws, cap, pieces = exec_stream
    frames = [b"\x01" + b"r%02d" % i for i in range(10)]
    server.send(b"".join(_frame(ABNF.OPCODE_BINARY, f) for f in frames) + _frame(ABNF.OPCODE_PING, b"p" * 200))
    with pytest.raises(aiohttp.WebSocketError):
        await asyncio.wait_for(cap._pump(ws, None), 10)
    assert b"".join(pieces) == b"".join(f[1:] for f in frames)


async def test_a_stop_on_v5_closes_stdin_and_reads_to_the_status(exec_stream):
    """stop() from another thread, on v5: the pump sends the stdin close ([255, 0]), keeps reading what tcpdump
    flushes, and returns the status of channel 3 with the stream ended while "stopping"."""
    server, ws, cap, pieces = exec_stream
    pump = asyncio.create_task(cap._pump(ws, None))
    server.send(_frame(ABNF.OPCODE_BINARY, b"\x01first"))
    await wait_until_async("the first frame handed on", 10, lambda: list(pieces), ok=lambda got: got == [b"first"])
    threading.Thread(target=cap.stop).start()
    await wait_until_async("stdin closed", 10, lambda: list(server.received), ok=lambda got: bytes((255, 0)) in got)
    status = json.dumps({"status": "Success"}).encode()
    server.send(_frame(ABNF.OPCODE_BINARY, b"\x01flushed") + _frame(ABNF.OPCODE_BINARY, b"\x03" + status)
                + _frame(ABNF.OPCODE_CLOSE, b"\x03\xe8"))
    assert await asyncio.wait_for(pump, 10) == (status, "stopping")
    assert pieces[-1] == b"flushed" and exit_code_of(status) == 0


async def test_a_stop_before_v5_closes_the_stream(tmp_path):
    """v4 has no half-close: a stop ends the stream from our side ("closed"), with what was read handed on."""
    async with _served(tmp_path, "v4.channel.k8s.io") as (server, ws, cap, pieces):
        assert ws.protocol == "v4.channel.k8s.io"
        pump = asyncio.create_task(cap._pump(ws, None))
        server.send(_frame(ABNF.OPCODE_BINARY, b"\x01only"))
        await wait_until_async("the frame handed on", 10, lambda: list(pieces), ok=lambda got: got == [b"only"])
        cap.stop()
        assert await asyncio.wait_for(pump, 10) == (None, "closed")
        assert bytes((255, 0)) not in server.received


def _kube(host: str, token: str | None) -> Kube:
    cfg = Configuration(host=host, api_key={"authorization": token} if token else None)
    return Kube(ApiClient(configuration=cfg), "ns", "ctx", 5.0)


def test_the_exec_target_is_the_clients_url_and_auth_and_its_repr_hides_the_token():
    """The URL is the pod's exec subresource on the kubeconfig's server, a ``command`` parameter a word; the auth
    header is the client Configuration's; the token never shows in repr (logs, errors)."""
    target = exec_target(_kube("https://198.18.0.1:6443", "Bearer s3cret-token"), "ns", "pod-a", "dbg",
                         ["tcpdump", "-i", "lo"])
    parts = urllib.parse.urlsplit(target.url)
    assert (parts.scheme, parts.netloc, parts.path) == ("wss", "198.18.0.1:6443", "/api/v1/namespaces/ns/pods/pod-a/exec")
    query = urllib.parse.parse_qsl(parts.query)
    assert [v for k, v in query if k == "command"] == ["tcpdump", "-i", "lo"]
    assert dict(query)["container"] == "dbg" and dict(query)["stdin"].lower() == "true"
    assert target.authorization == "Bearer s3cret-token"
    assert "s3cret" not in repr(target)
    assert exec_target(_kube("http://198.18.0.1:8080", None), "ns", "p", "c", ["true"]).url.startswith("ws://")
    # An expiring token (an exec plugin's, an OIDC one): the client's refresh hook runs, as in every REST call.
    kube = _kube("https://198.18.0.1:6443/prefix/", "Bearer old")
    kube.api.configuration.refresh_api_key_hook = lambda c: c.api_key.update(authorization="Bearer fresh")
    target = exec_target(kube, "ns", "p", "c", ["true"])
    assert target.authorization == "Bearer fresh"
    assert target.url.startswith("wss://198.18.0.1:6443/prefix/api/v1/namespaces/ns/pods/p/exec?command=true&")


async def test_a_refused_upgrade_says_the_servers_status_message(tmp_path):
    """A 403 with the API server's Status (RBAC) instead of the upgrade: the error is the Status's message, as
    kubectl prints it, and carries no auth header."""
    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                                  "message": 'pods "pod-a" is forbidden: cannot create resource "pods/exec"'},
                                 status=403)

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/pod-a/exec", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    path = str(tmp_path / "api.sock")
    await web.UnixSite(runner, path).start()
    try:
        target = exec_target(_kube("http://198.18.0.1:8080", "Bearer s3cret-token"), "ns", "pod-a", "dbg", ["true"])
        with pytest.raises(ApiException) as refused:
            await open_exec_ws(_kube("http://198.18.0.1:8080", None), target, aiohttp.UnixConnector(path))
        assert api_error_message(refused.value) == 'pods "pod-a" is forbidden: cannot create resource "pods/exec"'
        assert "s3cret" not in str(refused.value)
    finally:
        await runner.cleanup()


def test_the_copy_ends_at_its_limit_inside_a_burst(tmp_path):
    """--write-pcap's spool limit cuts the copy at the limit even when the burst that crosses it is handed on
    in one piece: the bytes before the limit are kept (the file header among them), none after."""
    cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, -1, tee_limit=10)
    path = tmp_path / "copy.pcap"
    with open(path, "wb", buffering=0) as tee:
        cap._deliver(b"0123456", tee)
        cap._deliver(b"789abcdef", tee)
        cap._deliver(b"ghi", tee)
    assert path.read_bytes() == b"0123456789" and cap.tee_full


def test_a_planted_link_is_never_written_through(tmp_path):
    """Issue 29, item 6: as root, into a directory where someone planted POD-IFACE.pcap -> a file of root's, the
    copy is refused (even with --overwrite) and the file it points at is untouched."""
    secret = tmp_path / "secret"
    secret.write_text("root's own")
    link = tmp_path / "pod-lo.pcap"
    link.symlink_to(secret)
    for replace in (False, True):
        read_fd, write_fd = os.pipe()
        cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, write_fd, tee_path=str(link), tee_replace=replace)
        cap.start()
        assert cap.join(10)
        os.close(read_fd)
        assert cap.error == f"cannot write {link}: it is a symbolic link; refused"
    assert secret.read_text() == "root's own" and link.is_symlink()


def test_a_file_of_the_same_name_is_refused_unless_replaced(tmp_path):
    old = tmp_path / "pod-eth0.pcap"
    old.write_bytes(b"earlier capture")
    os.chmod(old, 0o644)
    with pytest.raises(FileExistsError):
        open_copy(str(old))
    assert old.read_bytes() == b"earlier capture"
    assert copy_refusal(FileExistsError(17, "File exists"), str(old)) == "it exists (give --overwrite to replace it)"
    with open_copy(str(old), replace=True) as fh:
        fh.write(b"new")
    assert old.read_bytes() == b"new" and old.stat().st_mode & 0o777 == 0o600


def test_a_new_copy_is_owner_only(tmp_path):
    path = tmp_path / "pod-lo.pcap"
    with open_copy(str(path)) as fh:
        fh.write(b"x")
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_full_disk_stops_the_copy_not_the_capture():
    """Issue 29, item 7: ENOSPC (the kernel's, from /dev/full) on the copy: the copy stops with a reason naming
    it, and every byte still reaches the analysis."""
    analysed = []
    cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, -1, tee_path="/dev/full")
    cap.on_data = analysed.append
    with open("/dev/full", "wb", buffering=0) as tee:
        cap._deliver(b"header", tee)
        cap._deliver(b"packet", tee)
    assert analysed == [b"header", b"packet"]
    assert cap.tee_full and cap.error is None
    assert cap.tee_error == ("the copy /dev/full stopped after 0 bytes: No space left on device; the capture and "
                             "its analysis went on")


def test_overwrite_replaces_only_a_regular_file_of_ours(tmp_path):
    """Found by a break-it review: --overwrite truncated another user's file (which kept its owner, who could
    read the capture back) and opened a FIFO (a hang, and the capture to whoever reads it)."""
    fifo = tmp_path / "pod-eth0.pcap"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as refused:
        open_copy(str(fifo), replace=True)
    assert copy_refusal(refused.value, str(fifo)) == "it is not a regular file; refused"
    theirs = tmp_path / "pod-lo.pcap"
    theirs.write_bytes(b"theirs")
    os.chown(theirs, 65534, 65534)  # nobody's; the tests run as root
    with pytest.raises(OSError) as refused:
        open_copy(str(theirs), replace=True)
    assert copy_refusal(refused.value, str(theirs)) == "it belongs to another user (uid 65534); refused"
    assert theirs.read_bytes() == b"theirs"
    ours = tmp_path / "pod-x.pcap"
    ours.write_bytes(b"ours")
    os.chmod(ours, 0o644)
    with open_copy(str(ours), replace=True) as fh:
        fh.write(b"new")
    assert ours.read_bytes() == b"new" and ours.stat().st_uid == os.geteuid()
    assert ours.stat().st_mode & 0o777 == 0o600


def test_the_exec_tls_is_the_kubeconfigs(tmp_path):
    """TLS as the official client's websocket sets it up (ws_client.create_websocket): the kubeconfig's CA and
    the hostname checked; a client certificate and key loaded; verify_ssl off means no verification."""
    key, cert = tmp_path / "client.key", tmp_path / "client.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=meshdoctor-test",
                    "-days", "1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    cfg = Configuration(host="https://198.18.0.1:6443")
    cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file = str(cert), str(cert), str(key)
    ctx = ssl_context_of(cfg)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "meshdoctor-test"),),)]
    cfg.assert_hostname = False
    assert not ssl_context_of(cfg).check_hostname
    cfg.verify_ssl = False
    assert ssl_context_of(cfg).verify_mode == ssl.CERT_NONE
    cfg.key_file = str(tmp_path / "missing.key")
    with pytest.raises(OSError):
        ssl_context_of(cfg)
