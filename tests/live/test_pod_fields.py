"""``watch --dissect pod`` (sources/pod_fields.py): tshark's lines from the debug container give the events, frame
numbers included, that the local dissector gives for the same capture; the capture script's own failures."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from kubectl_meshdoctor.live import pod_fields
from kubectl_meshdoctor.live.pod_fields import PodFieldStream, pod_tshark_args
from kubectl_meshdoctor.live.pod_script import DISSECT_SCRIPT, capture_command

from .test_dissector import STREAMS, alone, records, writer

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="runs tshark")

DATA = Path(__file__).resolve().parent.parent / "data"


def pod_output(name: str) -> bytes:
    """What the pod's tshark writes for capture ``name``: the same arguments, its input a file."""
    return subprocess.run(["tshark", *pod_tshark_args(), "-r", str(DATA / name)], capture_output=True,
                          check=True, timeout=60).stdout


def through_stream(output: bytes, source: str, iface: str, seed: int, cut: int = 0) -> tuple[PodFieldStream, list]:
    """``output`` written into a PodFieldStream in random pieces by a thread, as a capture pump does, then
    ended; ``cut`` drops that many bytes from the end -> (the stream, its events)."""
    events: list = []

    async def main() -> PodFieldStream:
        stream = PodFieldStream(source, iface, events.append, asyncio.get_running_loop())
        t = writer(stream, [output], seed, cut_at=cut or None)
        t.start()
        await asyncio.wait_for(stream.result, 60)
        t.join(5)
        return stream

    return asyncio.run(main()), events


@pytest.mark.parametrize("pod,iface,name", STREAMS[:4])
def test_the_pods_lines_give_the_local_dissectors_events(pod, iface, name):
    want = alone(name, f"{pod}/{iface}", iface)
    assert want
    stream, got = through_stream(pod_output(name), f"{pod}/{iface}", iface, seed=len(name))
    assert got == want  # the same frames, fields, interface and pod, in order
    res = stream.result.result()
    assert (res.packets, res.last_frame, res.cut_short, res.error) == (len(want), want[-1].frame, False, None)
    assert res.frames_read == len(records((DATA / name).read_bytes())) - 1  # every record, yielded or not


def test_frame_numbers_survive_the_pods_tshark_session_resets(monkeypatch):
    monkeypatch.setattr(pod_fields, "SESSION_PACKETS", 7)
    pod, iface, name = STREAMS[1]
    total = len(records((DATA / name).read_bytes())) - 1
    assert total > 3 * 7
    want = alone(name, f"{pod}/{iface}", iface)
    stream, got = through_stream(pod_output(name), f"{pod}/{iface}", iface, seed=3)  # tshark ran with -M 7
    by_frame = {e.frame: e for e in got}
    # Every event a tshark without resets yields, at its frame; PREFILTER adds each session's first frame.
    assert [by_frame.get(w.frame) for w in want] == want
    assert len(got) - len(want) <= total // 7 + 1
    assert stream.result.result().frames_read is None  # io,stat may count the last session only: not claimed


def test_a_line_cut_short_is_not_an_event_and_says_so():
    pod, iface, name = STREAMS[0]
    output = pod_output(name)
    lines = output.split(b"\n")
    last_packet = max(i for i, line in enumerate(lines) if line[:1].isdigit())
    cut = len(b"\n".join(lines[last_packet:])) - 5  # into the last packet's line
    stream, got = through_stream(output, f"{pod}/{iface}", iface, seed=4, cut=cut)
    want = alone(name, f"{pod}/{iface}", iface)
    assert got == want[:-1]
    assert stream.result.result().cut_short


def test_a_lagging_event_loop_holds_the_pump_back_and_loses_nothing(monkeypatch):
    monkeypatch.setattr(pod_fields, "MAX_PENDING", 3)
    pod, iface, name = STREAMS[2]
    want = alone(name, f"{pod}/{iface}", iface)
    assert len(want) > 10
    _, got = through_stream(pod_output(name), f"{pod}/{iface}", iface, seed=5)
    assert got == want


def test_the_script_says_when_the_image_has_no_tshark(tmp_path):
    for tool in ("mktemp", "cat", "rm", "sleep"):  # a debug image without tshark (nor tcpdump)
        (tmp_path / tool).symlink_to(shutil.which(tool))
    argv = capture_command("lo", 5, "tcp", pod_tshark_args())
    assert argv[2] == DISSECT_SCRIPT
    proc = subprocess.run([shutil.which("sh"), *argv[1:]], capture_output=True, text=True, timeout=30,
                          env={"PATH": str(tmp_path)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 127
    assert proc.stderr.startswith("tshark: not found in the debug container")


def test_a_tcpdump_that_fails_at_once_ends_the_pods_tshark_too():
    """tcpdump cannot open its interface: tshark reads an empty pipe to its end and the script exits with
    tcpdump's status and complaint (no capture runs: the interface does not exist)."""
    argv = capture_command("md-no-such0", 5, "tcp", pod_tshark_args())
    # stdin stays open, as the exec's does while watch runs (its end would stop the capture)
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        rc = proc.wait(60)
        stderr = proc.stderr.read().decode()
        proc.stdin.close()
    assert rc == 1  # tcpdump's
    assert "tcpdump: md-no-such0: No such device exists" in stderr
