"""Our one way into pyshark's internals: tshark run by pyshark's PipeCapture, its output handed to us as batches of
whole lines instead of pyshark's packet objects (sources/tshark.py says why: speed).

pyshark has no public API for a custom tshark output, so this adapter overrides and calls its private methods.
They are listed in PYSHARK_INTERNALS, with the parameters we rely on; pyproject.toml pins pyshark's version, and
tests/sources/test_pyshark_adapter.py fails when a pyshark release moves any of them.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import subprocess
from collections.abc import Awaitable, Callable, Sequence

from pyshark.capture.pipe_capture import PipeCapture
from pyshark.tshark.output_parser.base_parser import BaseTsharkOutputParser
from pyshark.tshark.tshark import get_tshark_version

from .pipes import sized_pipe

# pyshark's private names this module overrides, calls or reads: class -> name -> the parameters it takes (for a
# method; None for an attribute), as pyshark 0.6 defines them.
PYSHARK_INTERNALS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "pyshark.tshark.output_parser.base_parser.BaseTsharkOutputParser": {
        "get_packets_from_stream": ("self", "stream", "existing_data", "got_first_packet"),
        "_extract_packet_from_data": ("self", "data", "got_first_packet"),
        "_parse_single_packet": ("self", "packet"),
    },
    "pyshark.capture.pipe_capture.PipeCapture": {
        "_get_tshark_version": ("self",),
        "_get_tshark_process": ("self", "packet_count"),
        "_get_tshark_path": ("self",),
        "get_parameters": ("self", "packet_count"),
        "_create_stderr_handling_task": ("self", "stderr"),
        "_created_new_process": ("self", "parameters", "process", "process_name"),
        "_setup_tshark_output_parser": ("self",),
        "_cleanup_subprocess": ("self", "process"),
        "packets_from_tshark": ("self", "packet_callback", "packet_count", "close_tshark"),
        "close": ("self",),
    },
}
# Attributes of a capture object that pyshark sets and we read: _pipe, _eof_reached, tshark_path (methods above),
# _stderr_handling_tasks and _last_error_line (tshark_complaint).
PYSHARK_ATTRIBUTES = ("_pipe", "_eof_reached", "tshark_path", "_stderr_handling_tasks", "_last_error_line")


class LineBatches(BaseTsharkOutputParser):
    """pyshark's output-parser hook: every complete line read so far, as one bytes batch. ``gate`` is awaited
    before each read (merge_by_time holds back a stream that runs ahead; tshark then waits on its pipe)."""

    # ~250 lines a batch: parsing one takes ~10 ms, and the event loop (a TUI's screen) runs between batches.
    DEFAULT_BATCH_SIZE = 2 ** 15

    def __init__(self, gate: Callable[[], Awaitable[None]] | None = None) -> None:
        self._gate = gate

    async def get_packets_from_stream(self, stream, existing_data, got_first_packet=True):
        if self._gate is not None:
            await self._gate()
        # A read from a StreamReader that already holds data does not suspend: yield to the loop ourselves.
        await asyncio.sleep(0)
        return await super().get_packets_from_stream(stream, existing_data, got_first_packet)

    def _extract_packet_from_data(self, data: bytes, got_first_packet: bool = True):
        cut = data.rfind(b"\n")
        if cut == -1:
            return None, data
        return data[:cut], data[cut + 1:]

    def _parse_single_packet(self, packet: bytes) -> bytes:
        return packet


POLLED_PIPE_BYTES = 1 << 20  # what tshark can write between two polls before it waits for us


class PolledPipe:
    """tshark's stdout, read without waking for each line: ``read`` takes what the pipe holds and, when it holds
    nothing, sleeps ``poll_s`` before it looks again. Nothing waits on the pipe while tshark writes, so a line
    flushed by ``-l`` is one cheap write(2), not a wake-up of our event loop: measured on a live capture's lines,
    tshark's CPU 6.5 -> 5.2 s and the reader's 1.4 -> 0.1 s for 250,000 lines (bench/RESULTS.md). The price is up
    to ``poll_s`` more latency. A pipe holding less than POLLED_PIPE_BYTES is read as each write comes instead.
    Takes ownership of ``fd`` (closed at end of file or by ``close``, which must not run while ``read`` waits)."""

    def __init__(self, fd: int, poll_s: float) -> None:
        os.set_blocking(fd, False)
        self._fd: int | None = fd
        self._poll_s = poll_s
        try:
            capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        except OSError:  # not a pipe: a read never finds it empty, so how it waits does not matter
            capacity = 0
        # A pipe that holds less than tshark may write in poll_s (F_SETPIPE_SZ refused: over pipe-max-size, or
        # the user over pipe-user-pages-soft, whose pipes get two pages, pipe(7)) would hold tshark up at every
        # poll: 64 KiB a 20 ms poll is ~3 MB/s, a third of what tshark writes. It is read as each write comes.
        self._as_it_comes = capacity < POLLED_PIPE_BYTES

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; b"" at end of file (or once closed)."""
        while self._fd is not None:
            try:
                data = os.read(self._fd, n)
            except BlockingIOError:
                if self._as_it_comes:
                    await self._readable(self._fd)
                else:
                    await asyncio.sleep(self._poll_s)
                continue
            if not data:
                self.close()
            return data
        return b""

    @staticmethod
    async def _readable(fd: int) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        # level-triggered: it may fire again before we run; only the first sets the result
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@functools.lru_cache(maxsize=None)
def tshark_version(path: str | None):
    return get_tshark_version(path)


class FieldsPipeCapture(PipeCapture):
    """PipeCapture whose tshark writes what ``output_args`` asks (sources/tshark.py FIELD_ARGS: ``-T fields``),
    handed over in line batches."""

    def _get_tshark_version(self):
        # pyshark asks `tshark -v` once per capture; a second tshark loading every dissector next to each
        # reader doubled the start-up memory peak. The version does not change while we run.
        return tshark_version(self.tshark_path)

    def __init__(self, *args, output_args: Sequence[str], line_buffered: bool = False, poll_s: float | None = None,
                 gate=None, **kwargs) -> None:
        """``line_buffered``: tshark flushes a line a packet (``-l``). ``poll_s``: tshark's output is read by
        polling every ``poll_s`` seconds while it is empty (PolledPipe), not as each write comes."""
        super().__init__(*args, **kwargs)
        self._output_args = tuple(output_args)
        self._line_buffered = line_buffered
        self._poll_s = poll_s
        self._polled: PolledPipe | None = None
        self._gate = gate
        self.exit_status: int | None = None  # tshark's, when it ended by itself (negative: killed by a signal)

    async def _get_tshark_process(self, packet_count=None):
        # As pyshark's own, with our output type; ``-l`` (flush per packet) only where latency matters (live).
        params = [self._get_tshark_path(), *self._output_args]
        if self._line_buffered:
            params.append("-l")
        params += self.get_parameters(packet_count=packet_count)
        if self._poll_s is None:
            process = await asyncio.create_subprocess_exec(*params, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                           stdin=self._pipe)
        else:
            read_fd, write_fd = sized_pipe(POLLED_PIPE_BYTES)
            try:
                process = await asyncio.create_subprocess_exec(*params, stdout=write_fd, stderr=subprocess.PIPE,
                                                               stdin=self._pipe)
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
            # pyshark reads process.stdout with read(n) only (BaseTsharkOutputParser.get_packets_from_stream)
            self._polled = process.stdout = PolledPipe(read_fd, self._poll_s)
        self._create_stderr_handling_task(process.stderr)
        self._created_new_process(params, process)
        return process

    def _setup_tshark_output_parser(self):
        return LineBatches(self._gate)

    async def _cleanup_subprocess(self, process):
        if self._polled is not None:
            self._polled.close()
        if self._eof_reached:
            # tshark closed its output: it is exiting by itself. Wait for it instead of pyshark's kill(): that
            # polls (reaps) the child first, racing asyncio's child watcher, which then logs "Unknown child
            # process" on stderr; and pyshark treats any non-zero exit after the end of output as a crash,
            # while tshark exits 2 for a capture cut short, which read_stream reports from tshark's last line.
            try:
                self.exit_status = await asyncio.wait_for(process.wait(), 10)
                return
            except asyncio.TimeoutError:
                pass
        await super()._cleanup_subprocess(process)

    def close(self) -> None:
        # packets_from_tshark already ended tshark and read_stream closes the fd once. The inherited close()
        # (also run from __del__) would start an event loop, which fails inside ours, and close the fd number
        # again, by then possibly another stream's.
        pass


async def tshark_complaint(capture: FieldsPipeCapture) -> str | None:
    """Once tshark's output has ended: its stderr drained (a pyshark task) and its last line, which says why it
    stopped early; None when that line is only -M's session notice or the running-as-root warning."""
    for task in list(getattr(capture, "_stderr_handling_tasks", [])):
        try:
            await task
        except Exception:  # the task ends with the process; its errors are not ours to raise
            pass
    error = getattr(capture, "_last_error_line", None)
    return None if error and ("resetting session" in error or "Running as user" in error) else error
