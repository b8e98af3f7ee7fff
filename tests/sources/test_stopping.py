"""However analyze of a big file ends, no copy of the capture outlives it: the chunks editcap splits it into live
in a private directory beside it, removed on Ctrl-C and SIGTERM; after a SIGKILL, by the next run. No editcap or
tshark of ours outlives it by more than 5 s."""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from ..waiting import wait_until

DATA = Path(__file__).parent.parent / "data"
T = TypeVar("T")
pytestmark = pytest.mark.skipif(not shutil.which("editcap"), reason="needs editcap")


def big_capture(tmp_path: Path, copies: int) -> Path:
    """The lab's lo capture, its records ``copies`` times over (6000: 18 MB, read in chunks)."""
    big = tmp_path / "lo.pcap"
    data = (DATA / "lab-collision-lo.pcap").read_bytes()
    with big.open("wb") as out:
        out.write(data[:24] + data[24:] * copies)  # one pcap header, then the records again and again
    return big


def running(proc: subprocess.Popen, name: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.name() == name:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def chunks(parent: Path) -> list[Path]:
    """The chunk files of analyze's private directories in ``parent``: editcap's, or the pre-pass's."""
    return [p for p in parent.glob(".meshdoctor-chunks-*/*") if p.name.startswith(("chunk_", "kept_"))]


def start_analyze(big: Path, phase: str) -> subprocess.Popen:
    """``analyze BIG -o json``, once its ``phase`` (editcap; tshark after editcap; tshark after the pre-pass:
    prepass) runs and a chunk is on disk."""
    env = {**os.environ, "MESHDOCTOR_PREPASS": "1" if phase == "prepass" else "0"}
    if phase == "prepass":  # the fast path decides a clean capture's records itself: no chunk, no tshark
        env["MESHDOCTOR_FASTPATH"] = "0"
    proc = subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(big), "-o", "json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def seen() -> list[Path]:
        found = chunks(big.parent) if running(proc, "tshark" if phase == "prepass" else phase) else []
        assert found or phase != "editcap" or not running(proc, "tshark"), "editcap ended before it was seen"
        return found

    while_running(proc, f"{phase} running and a chunk on disk", seen)
    return proc


def while_running(proc: subprocess.Popen, what: str, ready: Callable[[], T]) -> T:
    """``ready``'s first truthy value, looked for every 10 ms for up to 60 s; fails at once if analyze ends first."""
    def look() -> T:
        found = ready()
        assert found or proc.poll() is None, f"{what}: analyze ended first"
        return found

    return wait_until(what, 60, look, poll_s=0.01)


@pytest.mark.parametrize("signals, phase, copies", [
    ((signal.SIGTERM,), "tshark", 6000),  # 18 MB: chunked, seconds of tshark
    ((signal.SIGINT, signal.SIGINT), "tshark", 6000),  # an impatient Ctrl-C, twice
    ((signal.SIGINT,), "editcap", 30000),  # 90 MB: editcap is still splitting when it comes
    ((signal.SIGINT, signal.SIGINT), "editcap", 30000),
    ((signal.SIGTERM,), "prepass", 6000),  # the pre-pass's kept chunks, read by tshark
    ((signal.SIGINT, signal.SIGINT), "prepass", 6000),
])
def test_stopping_analyze_removes_its_chunks_and_processes(tmp_path, signals, phase, copies):
    """kill (SIGTERM) ends analyze as Ctrl-C does, and a second Ctrl-C does not cut the cleanup short: exit
    128+signal, no tshark or editcap left, no chunk files beside the input."""
    proc = start_analyze(big_capture(tmp_path, copies), phase)
    # Held mid-split (SIGSTOP), so the signal surely comes while editcap has chunks still to write, however busy
    # the machine. analyze must not wait for it: a SIGKILL ends a stopped process too, while the thread that once
    # ran editcap kept the process alive until editcap finished, and went on writing chunks.
    held = running(proc, "editcap") if phase == "editcap" else []
    for editcap in held:
        editcap.suspend()
    children = psutil.Process(proc.pid).children(recursive=True)
    try:
        for sig in signals:
            proc.send_signal(sig)
            # Not a wait for a state: a person's second Ctrl-C comes a moment later, and the exit code asserted below
            # allows for every place it can land (the loop's handler, the cleanup, the instant between).
            time.sleep(0.02)
        _, err = proc.communicate(timeout=30)
    finally:
        for editcap in held:
            try:
                editcap.resume()
            except psutil.NoSuchProcess:
                pass
    # -SIGINT: a second Ctrl-C in the instant between removing the loop's handler and ignoring the signal
    assert proc.returncode in {128 + signals[0]} | ({-signals[-1]} if len(signals) > 1 else set()), err
    assert b"Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert not list(tmp_path.glob(".meshdoctor-chunks-*"))  # also once nothing it started can write there


@pytest.mark.parametrize("phase, copies", [("editcap", 30000), ("tshark", 6000), ("prepass", 6000)])
def test_sigkilled_analyze_leaves_no_helper_and_the_next_run_removes_its_chunks(tmp_path, phase, copies):
    """SIGKILL leaves no time to clean up: editcap and tshark die with analyze (within 5 s), and the chunks it
    left are removed when the next analyze starts, while a live process's are kept."""
    big = big_capture(tmp_path, copies)
    proc = start_analyze(big, phase)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, alive
    (left,) = tmp_path.glob(".meshdoctor-chunks-*")
    assert left.stat().st_mode & 0o777 == 0o700 and chunks(tmp_path)
    kept = tmp_path / f".meshdoctor-chunks-{os.getpid()}-kept"  # this test's process lives on
    kept.mkdir(mode=0o700)
    small = tmp_path / "small.pcap"
    shutil.copy(DATA / "lab-collision-lo.pcap", small)
    nxt = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(small), "-o", "json"],
                         capture_output=True, timeout=120)
    assert nxt.returncode in (0, 1), nxt.stderr
    assert not left.exists() and kept.exists()


def big_pair(tmp_path: Path, copies: int) -> tuple[Path, Path]:
    """lo and eth0 of the lab's collision capture, their records ``copies`` times over each."""
    lo = big_capture(tmp_path, copies)
    eth0 = tmp_path / "eth0.pcap"
    data = (DATA / "lab-collision-eth0.pcap").read_bytes()
    with eth0.open("wb") as out:
        out.write(data[:24] + data[24:] * copies)
    return eth0, lo


def reader_child(proc: subprocess.Popen) -> list[psutil.Process]:
    """analyze's reader process (sources/reader_process.py), once it runs."""
    found = []
    for child in psutil.Process(proc.pid).children():
        try:
            if "kubectl_meshdoctor.sources.reader_process" in child.cmdline():
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.mark.parametrize("fastpath", ["0", "1"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_analyze_of_a_pair_through_one_tshark_leaves_nothing(tmp_path, sig, fastpath):
    """Two captures through one stream (sources/interleave.py), read in a child process (reader_process.py):
    SIGTERM ends analyze as Ctrl-C does, SIGKILL leaves no time to clean up; either way the child and its tshark
    (every record goes through one without the fast path; a clean capture needs none with it) are gone within
    10 s, and nothing is left beside the input."""
    eth0, lo = big_pair(tmp_path, 6000)
    proc = subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(eth0), str(lo), "-o",
                             "json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "MESHDOCTOR_PREPASS": "1", "MESHDOCTOR_FASTPATH": fastpath})
    if fastpath == "0":
        while_running(proc, "tshark running", lambda: running(proc, "tshark"))
    else:
        while_running(proc, "reader process running", lambda: reader_child(proc))
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (128 + sig if sig != signal.SIGKILL else -sig), err
    assert b"Traceback" not in err
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eth0.pcap", "lo.pcap"]
