"""Pipes that hold more than Linux's default 64 KiB (pipe(7)), for a writer that must not wait on its reader's
short pauses: tshark between two polls of ours (sources/pyshark_adapter.py), the reader process between two
batches of the detectors' process (sources/reader_process.py)."""

from __future__ import annotations

import fcntl
import os


def grow_pipe(fd: int, nbytes: int) -> None:
    """Grow the pipe ``fd`` is an end of to hold ``nbytes`` (fcntl F_SETPIPE_SZ, Linux). Linux may refuse (above
    /proc/sys/fs/pipe-max-size, or the user over pipe-user-pages-soft, pipe(7)), and ``fd`` may be no pipe: it
    then keeps its size, which only costs waits; F_GETPIPE_SZ tells."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, nbytes)
    except OSError:
        pass


def sized_pipe(nbytes: int) -> tuple[int, int]:
    """os.pipe() -> (read fd, write fd), grown to hold ``nbytes`` where Linux allows (grow_pipe)."""
    read_fd, write_fd = os.pipe()
    grow_pipe(write_fd, nbytes)
    return read_fd, write_fd
