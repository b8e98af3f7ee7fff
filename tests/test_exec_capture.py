"""ExecCapture's own failures, before any API server is involved, and how exec statuses read."""

from __future__ import annotations

import json
import os

from kubectl_meshdoctor.kube.capture import ExecCapture, exit_code_of, status_message


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
