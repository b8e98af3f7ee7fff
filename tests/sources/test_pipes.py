"""Grown pipes (sources/pipes.py); the reader process's stdout grown to hold several of its messages, and its
garbage collector tuned as the analyze process's (gc_tuning.py)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil

import psutil
import pytest

from kubectl_meshdoctor.sources import interleave, reader_process
from kubectl_meshdoctor.sources.pipes import grow_pipe, sized_pipe
from tests.sources.test_fastpath_interleave import DATA, PAIRS

MAX = int(open("/proc/sys/fs/pipe-max-size").read())
needs_room = pytest.mark.skipif(MAX < reader_process.PIPE_BYTES, reason="pipe-max-size is below what is asked")


@needs_room
def test_a_sized_pipe_holds_what_was_asked_and_more_than_the_default():
    read_fd, write_fd = sized_pipe(1 << 20)
    try:
        assert fcntl.fcntl(read_fd, fcntl.F_GETPIPE_SZ) >= 1 << 20 > 65536
        os.set_blocking(write_fd, False)
        assert os.write(write_fd, b"x" * (1 << 20)) == 1 << 20  # all of it, without waiting for a reader
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_size_linux_refuses_or_a_descriptor_that_is_no_pipe_is_left_as_it_is(tmp_path):
    read_fd, write_fd = os.pipe()
    try:
        before = fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ)
        grow_pipe(write_fd, MAX * 2)  # above pipe-max-size: EPERM for a user without CAP_SYS_RESOURCE, else
        after = fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ)
        assert after == before or after >= MAX * 2
    finally:
        os.close(read_fd)
        os.close(write_fd)
    with open(tmp_path / "plain", "wb") as f:
        grow_pipe(f.fileno(), 1 << 20)  # EBADF: no pipe, nothing raised
        f.write(b"still a file")
    assert (tmp_path / "plain").read_bytes() == b"still a file"


@needs_room
@pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")
def test_the_reader_processs_stdout_holds_several_messages():
    lo, eth0 = (str(DATA / p) for p in PAIRS[0])
    me = psutil.Process()
    sizes: list[int] = []

    def on_event(ev) -> None:  # the child is writing: the size of its stdout's pipe, through a new read end
        if not sizes:
            child = next(c for c in me.children() if "reader_process" in " ".join(c.cmdline()))
            fd = os.open(f"/proc/{child.pid}/fd/1", os.O_RDONLY | os.O_NONBLOCK)
            try:
                sizes.append(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
            finally:
                os.close(fd)

    asyncio.run(reader_process.read_apart([lo, eth0], [lo, eth0], ["lo", "eth0"], [False, False],
                                          interleave.interleavable([lo, eth0]), on_event))
    assert sizes and sizes[0] >= reader_process.PIPE_BYTES


def test_the_reader_process_collects_as_seldom_as_the_analyze_process():
    """Its default thresholds (a young collection every 700 allocations) cost the reader ~4% of its CPU."""
    import pickle
    import subprocess
    import sys

    from kubectl_meshdoctor.gc_tuning import GC_THRESHOLDS

    probe = ("import gc, sys\n"
             "from kubectl_meshdoctor.sources import reader_process as r\n"
             "def run(job):\n"
             "    job.close()\n"
             "    print(gc.get_threshold(), gc.get_freeze_count() > 0, file=sys.stderr)\n"
             "r.asyncio.run = run\n"
             "sys.exit(r.main())\n")
    done = subprocess.run([sys.executable, "-c", probe], input=pickle.dumps(([], [], [], [], b"", False)),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().split("\n")[0] == f"{GC_THRESHOLDS} True"
