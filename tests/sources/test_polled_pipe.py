"""tshark's output read by polling (sources/pyshark_adapter.py PolledPipe), against real tshark: whatever the pipe
holds and however fast tshark writes, the lines are those of pyshark's own reader, the reader never holds tshark
up for a poll at a time, and no descriptor or tshark outlives a capture that failed, was killed or cancelled."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest

from kubectl_meshdoctor.sources.pyshark_adapter import FieldsPipeCapture, PolledPipe
from kubectl_meshdoctor.sources.tshark import ALL_TCP, FIELD_ARGS, TSHARK_ARGS

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="runs tshark")

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def big_pcap(tmp_path_factory) -> Path:
    """A recorded capture's records eight times over (~2 MB, ~19,000 frames): tshark's lines of it (~2.9 MB)
    are more than a 1 MiB pipe holds."""
    data = (DATA / "lab-collision3m-eth0.pcap").read_bytes()
    assert struct.unpack_from("<I", data)[0] == 0xA1B2C3D4  # little-endian pcap: the header is copied as is
    path = tmp_path_factory.mktemp("polled") / "eight-times.pcap"
    path.write_bytes(data[:24] + data[24:] * 8)
    return path


def open_fds() -> dict[str, str]:
    """This process's open descriptors: number -> what each is (/proc/self/fd)."""
    out = {}
    for n in os.listdir("/proc/self/fd"):
        try:
            out[n] = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # the listing's own descriptor, gone by now
            pass
    return out


def _tsharks() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "tshark"]


async def _read(pcap: Path, on_batch=None, display_filter: str | None = ALL_TCP,
                **kwargs) -> tuple[list[bytes], FieldsPipeCapture]:
    """tshark's lines of ``pcap`` through FieldsPipeCapture (``kwargs``: poll_s, custom_parameters...)."""
    batches: list[bytes] = []
    fd = os.open(pcap, os.O_RDONLY)
    kwargs.setdefault("custom_parameters", list(TSHARK_ARGS))
    capture = FieldsPipeCapture(fd, output_args=FIELD_ARGS, display_filter=display_filter,
                                eventloop=asyncio.get_running_loop(), **kwargs)

    def got(batch: bytes) -> None:
        batches.append(batch)
        if on_batch is not None:
            on_batch(capture, len(batches))

    try:
        await capture.packets_from_tshark(got, close_tshark=True)
    finally:
        os.close(fd)
    return b"\n".join(batches).split(b"\n"), capture


def test_a_pipe_too_small_to_poll_is_read_as_each_line_comes(big_pcap):
    """F_SETPIPE_SZ can be refused (a user over /proc/sys/fs/pipe-user-pages-soft gets pipes of two pages,
    pipe(7)); a poll every poll_s of a pipe that small would let tshark write one pipeful a poll: ~2.9 MB at 4 KiB
    a 50 ms poll is over 35 s. The lines must come as fast as tshark writes them, here within 20 s."""
    want = subprocess.run(["tshark", *FIELD_ARGS, "-Y", ALL_TCP, *TSHARK_ARGS, "-l", "-r", str(big_pcap)],
                          capture_output=True, check=True, timeout=60).stdout
    assert len(want) > 2_000_000
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)  # shrinking is always allowed
    assert fcntl.fcntl(read_fd, fcntl.F_GETPIPE_SZ) == 4096
    proc = subprocess.Popen(["tshark", *FIELD_ARGS, "-Y", ALL_TCP, *TSHARK_ARGS, "-l", "-r", str(big_pcap)],
                            stdout=write_fd, stderr=subprocess.DEVNULL)
    os.close(write_fd)
    before = open_fds()

    async def read_all() -> bytes:
        pipe = PolledPipe(read_fd, 0.05)
        parts = []
        try:
            while chunk := await pipe.read(1 << 15):
                parts.append(chunk)
        finally:
            pipe.close()
        return b"".join(parts)

    try:
        got = asyncio.run(asyncio.wait_for(read_all(), 20))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert got == want
    assert set(open_fds()) <= set(before) - {str(read_fd)}


def test_a_tshark_that_fills_the_pipe_while_we_are_busy_loses_no_line(big_pcap):
    """Our event loop busy (a TUI painting) while tshark writes more than the polled pipe holds: tshark waits,
    and every line comes whole and in order, as pyshark's own reader gives them."""
    plain, _ = asyncio.run(_read(big_pcap))
    full: list[int] = []

    def busy(capture: FieldsPipeCapture, n: int) -> None:
        fd = capture._polled._fd
        if n > 1 or fd is None:
            return
        capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        deadline = time.monotonic() + 30
        buf = bytearray(4)
        while time.monotonic() < deadline:  # the loop blocked: nothing else of ours runs meanwhile
            fcntl.ioctl(fd, termios.FIONREAD, buf)
            held = int.from_bytes(buf, sys.byteorder)
            if held >= capacity * 15 // 16:  # full: a line that does not fit a page's rest starts the next
                full.append(held)
                return
            time.sleep(0.01)

    polled, capture = asyncio.run(_read(big_pcap, busy, line_buffered=True, poll_s=0.02))
    assert full, "tshark never filled the pipe"
    assert capture.exit_status == 0 and len(plain) > 15_000
    assert polled == plain
    numbers = [int(line.split(b"\t", 1)[0]) for line in polled if line[:1].isdigit()]
    assert numbers == sorted(set(numbers))  # frame numbers in order, none twice


def test_session_resets_come_through_the_polled_pipe_as_through_pyshark(big_pcap):
    """-M: tshark numbers frames from 1 again every N packets; the same lines either way."""
    params = list(TSHARK_ARGS) + ["-M", "1000"]
    plain, _ = asyncio.run(_read(big_pcap, custom_parameters=params))
    polled, _ = asyncio.run(_read(big_pcap, custom_parameters=params, line_buffered=True, poll_s=0.02))
    assert polled == plain
    assert sum(1 for line in polled if line.startswith(b"1\t")) > 10


@pytest.mark.parametrize("how", ["killed", "cancelled", "not startable", "refusing its arguments"])
def test_no_descriptor_or_tshark_outlives_a_polled_capture(big_pcap, tmp_path, how):
    """However tshark's run ends, inside the one event loop a watch keeps: its pipe is closed and tshark gone."""

    async def run() -> tuple[dict[str, str], dict[str, str], str]:
        before = open_fds()
        kwargs: dict = {"line_buffered": True, "poll_s": 0.02}
        if how == "not startable":
            fake = tmp_path / "bin" / "tshark"
            fake.parent.mkdir()
            fake.write_text("not a program\n")  # there, but not executable: exec fails after our pipe exists
            # No display filter: pyshark would first run the fake for its version, before any pipe of ours.
            kwargs.update(tshark_path=str(fake), display_filter=None)
        if how == "refusing its arguments":
            kwargs["custom_parameters"] = list(TSHARK_ARGS) + ["-o", "no.such.preference:1"]
        first = asyncio.Event()
        task = asyncio.ensure_future(_read(big_pcap, lambda c, n: first.set(), **kwargs))
        if how in ("killed", "cancelled"):
            await asyncio.wait_for(first.wait(), 30)
            if how == "killed":
                (tshark,) = _tsharks()
                tshark.send_signal(signal.SIGKILL)
            else:
                task.cancel()
        try:
            _, capture = await asyncio.wait_for(task, 30)
            outcome = f"exit {capture.exit_status}"
        except asyncio.CancelledError:
            outcome = "cancelled"
        except OSError as exc:
            outcome = type(exc).__name__
        await asyncio.sleep(0)
        return before, open_fds(), outcome

    before, after, outcome = asyncio.run(run())
    assert outcome == {"killed": "exit -9", "cancelled": "cancelled", "not startable": "PermissionError",
                       "refusing its arguments": "exit 1"}[how]
    assert {k: v for k, v in after.items() if k not in before} == {}
    _, alive = psutil.wait_procs(_tsharks(), timeout=5)
    assert not alive


def test_a_read_of_a_small_pipe_cancelled_while_it_waits_leaves_no_reader_on_the_loop():
    """Read as it comes (a pipe under POLLED_PIPE_BYTES) and cancelled, as abandon() cancels a dissection: the
    event loop no longer watches that fd (its number is the next pipe's), and nothing written is lost to it."""

    async def run() -> tuple[bool, bytes]:
        read_fd, write_fd = os.pipe()  # the default 64 KiB
        pipe = PolledPipe(read_fd, 0.02)
        waiting = asyncio.ensure_future(pipe.read(1 << 15))
        await asyncio.sleep(0)  # it finds the pipe empty and waits
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        still_watched = asyncio.get_running_loop().remove_reader(read_fd)
        os.write(write_fd, b"1\tline\n")
        got = await asyncio.wait_for(pipe.read(1 << 15), 5)
        pipe.close()
        os.close(write_fd)
        return still_watched, got

    assert asyncio.run(run()) == (False, b"1\tline\n")
