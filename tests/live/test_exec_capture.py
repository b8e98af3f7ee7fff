"""ExecCapture's own failures, before any API server is involved, and how exec statuses read."""

from __future__ import annotations

import json
import os
import socket
import threading
import types

import pytest
from websocket import ABNF, WebSocket, WebSocketProtocolException

from kubectl_meshdoctor.kube.exec import exit_code_of, status_message
from kubectl_meshdoctor.live.capture_copy import copy_refusal, open_copy
from kubectl_meshdoctor.live.pump import ExecCapture
from tests.waiting import wait_until


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
    return ABNF(1, 0, 0, 0, opcode, 0, data).format()  # as a server sends it: unmasked


@pytest.fixture
def exec_stream():
    """(the server's end of a real socket pair, the pump's websocket-client WebSocket over the other end as the
    exec stream's WSClient holds it, an ExecCapture, the pieces it hands on)."""
    server, client = socket.socketpair()
    ws = WebSocket(skip_utf8_validation=True)
    ws.sock, ws.connected = client, True
    pieces: list[bytes] = []
    cap = ExecCapture(None, "ns", "pod", "dbg", "lo", 5, -1, on_data=pieces.append)
    yield server, types.SimpleNamespace(sock=ws), cap, pieces
    server.close()
    client.close()


def test_the_pump_hands_a_burst_on_in_one_piece_and_a_lone_frame_at_once(exec_stream):
    """Frames already waiting are read back to back and handed on together, in order; a frame that comes
    alone is handed on without waiting for more; what came before the close is handed on before the end.
    The websocket is websocket-client's own over a real socket pair (the exec stream's framing, channel 1)."""
    server, ws, cap, pieces = exec_stream
    burst = [b"\x01" + b"r%03d" % i for i in range(50)]
    server.sendall(b"".join(_frame(ABNF.OPCODE_BINARY, f) for f in burst))
    result: list = []
    pump = threading.Thread(target=lambda: result.append(cap._pump(ws, None)))
    pump.start()
    wait_until("the burst handed on", 10, lambda: b"".join(pieces) == b"".join(f[1:] for f in burst))
    assert len(pieces) < len(burst)  # gathered: not one write a frame
    server.sendall(_frame(ABNF.OPCODE_BINARY, b"\x01alone"))
    # Nothing else is sent: it was not held back for company.
    wait_until("the lone frame handed on", 10, lambda: pieces[-1] == b"alone")
    server.sendall(_frame(ABNF.OPCODE_BINARY, b"\x01last") + _frame(ABNF.OPCODE_CLOSE, b"\x03\xe8"))
    pump.join(10)
    assert not pump.is_alive() and result[0] == (None, "ran")
    assert pieces[-1] == b"last"


def test_frames_read_before_a_bad_frame_are_handed_on_before_the_error(exec_stream):
    """websocket-client raises for a frame the protocol forbids (here a ping longer than 125 bytes, RFC 6455
    section 5.5): the stdout frames read in the same burst still reach the stream, and the error is raised."""
    server, ws, cap, pieces = exec_stream
    frames = [b"\x01" + b"r%02d" % i for i in range(10)]
    server.sendall(b"".join(_frame(ABNF.OPCODE_BINARY, f) for f in frames) + _frame(ABNF.OPCODE_PING, b"p" * 200))
    with pytest.raises(WebSocketProtocolException):
        cap._pump(ws, None)
    assert b"".join(pieces) == b"".join(f[1:] for f in frames)


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
