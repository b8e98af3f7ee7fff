"""The pump: a capture's exec stream (tcpdump in the debug container, live/pod_script.py) moved byte for byte from
the websocket to whoever reads it (a pipe, the dissector's stream) and to a copy, if one is kept.

Each stream is pumped by its own thread, running an asyncio loop of its own around one aiohttp websocket
(kube/exec.py: aiohttp's frame reader is compiled; websocket-client's, the official client's transport, cost
11-15 us a frame, about a packet a frame with tcpdump -U: bench/RESULTS.md), into an OS pipe whose read end
tshark consumes. A slow consumer blocks the pump, and with it the loop's reads, which is the back-pressure we
want (the kernel then counts drops, which tcpdump reports on exit) rather than unbounded buffering here.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from kubernetes.stream import ws_client

from kubectl_meshdoctor.kube.client import Kube, api_error_message
from kubectl_meshdoctor.kube.exec import CLOSE_CHANNEL, exec_target, exit_code_of, open_exec_ws, status_message

from .capture_copy import copy_refusal, open_copy
from .pod_script import capture_command

STOP_GRACE_S = 10.0  # how long tcpdump may take to flush and exit after we asked it to stop
# Seconds a burst of capture frames may gather in the socket before it is read (see _Reading._burst_read): 20 ms
# rather than 5 took the pump threads from 1.6 to 0.7-0.9 s of CPU over bench/live's 300k packets, and watch's
# main thread from 7.7 to 7.0 s (bigger batches into tshark and out of it); a packet that comes alone is not held.
GATHER_S = 0.02
HELD_FRAMES = 256  # frames read in one burst before they are handed on regardless


@dataclass(slots=True)
class ExecCapture:
    """One tcpdump exec stream pumped into ``write_fd`` by a thread; ``tee_path`` keeps a copy on request.

    After ``join``: ``returncode`` is tcpdump's exit status (None when no status with an exit code came: the stream
    was lost, we closed it, or the exec failed), ``stderr`` its last lines, ``dropped_by_kernel`` the count it
    reported, ``error`` a one-line reason when the stream did not end as asked (lost, even while stopping; the
    exec or tcpdump failed; the copy could not be written).
    """

    kube: Kube
    namespace: str
    pod: str
    container: str
    iface: str
    max_seconds: int
    write_fd: int
    tee_path: str | None = None
    tee_limit: int | None = None  # bytes: past this the copy stops (a spool must not fill the disk)
    tee_replace: bool = False  # an existing regular file at tee_path is replaced (else refused)
    bpf: str = "tcp"  # the BPF filter tcpdump captures with (live/pod_script.py writes the lean one)
    tshark_args: list[str] | None = None  # set: the lines of a tshark in the pod are the stream (live/pod_fields.py)
    tee_full: bool = False
    tee_error: str | None = None  # why the copy stopped before the capture did (a full disk): the capture goes on
    bytes_received: int = 0
    returncode: int | None = None
    stderr: str = ""
    error: str | None = None
    failed: bool = False  # the stream ended in ``error`` before it was asked to stop (not merely its last bytes)
    started: threading.Event = field(default_factory=threading.Event)
    # Set once tcpdump says "listening on" (its interface is open: packets from now on are captured), or when
    # the stream ends without that, so waiters never hang.
    listening: threading.Event = field(default_factory=threading.Event)
    heard_listening: bool = False  # tcpdump itself said "listening on": a capture really ran
    # Called from the pump's thread: with each piece of the stream (write_fd may then be -1: on_data is where the
    # stream goes); once the stream is over (and write_fd closed).
    on_data: Callable[[bytes], None] | None = None
    on_end: Callable[[], None] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _wake: Callable[[], None] | None = None  # the pump loop's stop signal, set from any thread (see stop)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.pod}-{self.iface}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask tcpdump to finish (stdin EOF -> SIGINT in the pod); the pump drains what it flushes."""
        self._stop.set()
        wake = self._wake
        if wake is not None:
            wake()

    @property
    def stop_asked(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def captured(self) -> int | None:
        """The packets tcpdump wrote (its exit summary), None before it ended."""
        m = re.search(r"(\d+) packets? captured", self.stderr)
        return int(m.group(1)) if m else None

    @property
    def dropped_by_kernel(self) -> int | None:
        m = re.search(r"(\d+) packets? dropped by kernel", self.stderr)
        return int(m.group(1)) if m else None

    def _run(self) -> None:
        tee = None
        try:
            if self.tee_path:
                try:  # unbuffered: the copy on disk is read while the capture runs (saving a finding from the TUI)
                    tee = open_copy(self.tee_path, self.tee_replace)
                except OSError as e:
                    self.error = f"cannot write {self.tee_path}: {copy_refusal(e, self.tee_path)}"
                    self.failed = True
                    return
            command = capture_command(self.iface, self.max_seconds, self.bpf, self.tshark_args)
            status, ended = asyncio.run(self._stream(command, tee))
            stopping = self._stop.is_set() or ended == "stopping"
            if status is not None:
                self.returncode = exit_code_of(status)
            if status is None and ended != "closed" and self.error is None:
                # Also after stop(): tcpdump's last packets and its drop counts come before the status, so a
                # stream that ends without one has lost them.
                when = " while tcpdump was stopping" if ended == "stopping" else ""
                self.error = f"capture stream on {self.iface} ended without an exit status{when} (connection lost)"
            elif status is not None and self.returncode is None and not self._stop.is_set():
                # A Failure without an exit code: the exec itself failed (container gone, no tcpdump in the image).
                self.error = f"capture stream on {self.iface}: {status_message(status)}"
            elif self.returncode not in (None, 0) and not self._stop.is_set():
                what = "the capture (tcpdump, tshark)" if self.tshark_args else "tcpdump"
                self.error = f"{what} on {self.iface} failed: {self._why_tcpdump_failed()}"
            elif self.returncode == 0 and not self._stop.is_set():
                # Ended by itself (kill -TERM/-INT in the pod): the report must not look like a whole capture.
                self.error = (f"tcpdump on {self.iface} ended before the capture was stopped (exit 0); "
                              f"later packets on {self.iface} were not captured")
            self.failed = self.error is not None and not stopping
        except Exception as e:  # the API refused the exec or the connection broke: report, never lose silently
            self.error = f"capture stream on {self.iface}: {api_error_message(e)}"
            self.failed = not self._stop.is_set()
        finally:
            self.started.set()
            self.listening.set()
            if tee is not None:
                tee.close()
            if self.write_fd >= 0:
                os.close(self.write_fd)  # EOF for tshark
            if self.on_end is not None:
                self.on_end()

    def _why_tcpdump_failed(self) -> str:
        """tcpdump's own complaint, else what its exit code says (the pod's shell gives 128+N for signal N)."""
        code = self.returncode or 0
        if code == 124:  # timeout(1): the capture outlived its own time limit
            return f"stopped by its time limit of {self.max_seconds} s (exit 124)"
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()
                 and not line.startswith("listening on") and "tcpdump: listening on" not in line
                 and not re.match(r"\d+ packets? (captured|received by filter|dropped by kernel)", line)]
        own = [line for line in lines if line.startswith(("tcpdump:", "tshark:"))]
        if own or lines:
            return (own or lines)[-1]
        return f"killed by signal {code - 128} (exit {code})" if code > 128 else f"exit code {code}"

    async def _stream(self, command: list[str], tee) -> tuple[bytes | None, str]:
        """Open the exec websocket, pump it (``_pump``), close it; what ``_pump`` returns."""
        target = exec_target(self.kube, self.namespace, self.pod, self.container, command)
        session, ws = await open_exec_ws(self.kube, target)
        try:
            self.started.set()
            return await self._pump(ws, tee)
        finally:
            try:
                await asyncio.wait_for(ws.close(), STOP_GRACE_S)
            except Exception:  # the stream is over either way; a close that fails must not hide why
                pass
            await session.close()

    async def _pump(self, ws: aiohttp.ClientWebSocketResponse, tee) -> tuple[bytes | None, str]:
        """Move frames from the websocket to the pipe until the stream ends -> (the channel-3 status or None, how
        it ended: "closed" by us (no half-close before v5, or the stop grace ran out), by the other end while
        tcpdump was "stopping", or by the other end while it "ran").

        Raises what the websocket reports as an error (a frame the protocol forbids), once the frames read
        before it are handed on.
        """
        loop = asyncio.get_running_loop()
        stop_asked = asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(stop_asked.set)
        if self._stop.is_set():  # stop() came before _wake was there
            stop_asked.set()
        read = _Reading(self, tee)
        reader = asyncio.create_task(read.frames(ws))
        waiter = asyncio.create_task(stop_asked.wait())
        try:
            await asyncio.wait((reader, waiter), return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                read.stopping = True
                if ws.protocol != ws_client.V5_CHANNEL_PROTOCOL:
                    reader.cancel()  # no half-close before v5: closing the stream closes stdin too
                    read.ended = "closed"
                else:
                    try:  # stdin EOF: the pod's watchdog SIGINTs tcpdump, which flushes and exits
                        await ws.send_bytes(bytes((CLOSE_CHANNEL, ws_client.STDIN_CHANNEL)))
                    except (aiohttp.ClientError, OSError):
                        pass  # the stream is going already: the reader sees its end
                    await asyncio.wait((reader,), timeout=STOP_GRACE_S)
                    if not reader.done():
                        self.error = (f"tcpdump on {self.iface} did not stop within {STOP_GRACE_S:.0f} s; "
                                      f"stream closed")
                        reader.cancel()
                        read.ended = "closed"
            try:
                await reader
            except asyncio.CancelledError:
                if not reader.cancelled():
                    raise
        finally:
            self._wake = None
            waiter.cancel()
            if not reader.done():
                reader.cancel()
            self.stderr = read.err_tail.decode("utf-8", "replace")
        return read.status, read.ended

    def _deliver(self, payload: bytes, tee) -> None:
        before = self.bytes_received
        self.bytes_received += len(payload)
        if tee is not None and not self.tee_full:
            try:
                if self.tee_limit is not None and self.bytes_received > self.tee_limit:
                    self.tee_full = True  # the copy ends at the limit, in a record cut short: readers stop there
                    if before < self.tee_limit:
                        tee.write(payload[:self.tee_limit - before])
                else:
                    tee.write(payload)
            except OSError as e:  # ENOSPC, EDQUOT, EIO: the copy stops, the capture and its analysis go on
                self.tee_full = True
                self.tee_error = (f"the copy {self.tee_path} stopped after {before} bytes: {e.strerror or e}; "
                                  f"the capture and its analysis went on")
        if self.on_data is not None:
            self.on_data(payload)  # blocks when tshark lags: back-pressure to tcpdump
        view = memoryview(payload) if self.write_fd >= 0 else b""
        while view:
            try:
                n = os.write(self.write_fd, view)  # blocks when tshark lags: back-pressure to tcpdump
            except BrokenPipeError:  # tshark went away; keep draining so tcpdump is not blocked
                return
            view = view[n:]


class _Reading:
    """The frames of one exec stream as they are read (``frames``): stdout handed on in bursts, stderr's tail
    kept, the status of channel 3, how the stream ended."""

    def __init__(self, cap: ExecCapture, tee) -> None:
        self.cap = cap
        self.tee = tee
        self.held: list[bytes] = []  # stdout payloads of this burst, handed on together
        self.gathering = False
        self.err_tail = b""
        self.status: bytes | None = None
        self.ended = "ran"
        self.stopping = False

    def hand_on(self) -> None:
        if self.held:
            payload = b"".join(self.held)
            self.held.clear()
            self.cap._deliver(payload, self.tee)

    def _burst_read(self) -> None:
        # Called by the loop once the reading task waits on an empty queue: every frame of the last socket read
        # has been parsed and held. They go on in one write, and the loop then sleeps so that the next burst
        # gathers in the socket: one read, one wake-up and one pipe write for many frames instead of one a frame
        # (at 10,000 packets/s nearly every packet comes in a frame of its own; bench/RESULTS.md). A packet waits
        # GATHER_S at most; one that comes alone is handed on at once.
        self.gathering = False
        if self.held:
            self.hand_on()
            time.sleep(GATHER_S)

    async def frames(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                msg = await ws.receive()
                kind = msg.type
                if kind is aiohttp.WSMsgType.BINARY or kind is aiohttp.WSMsgType.TEXT:
                    data = msg.data if kind is aiohttp.WSMsgType.BINARY else msg.data.encode()
                    if not data:
                        continue
                    channel = data[0]
                    if channel == ws_client.STDOUT_CHANNEL:
                        if len(data) > 1:
                            self.held.append(data[1:])
                            if len(self.held) >= HELD_FRAMES:
                                self.hand_on()
                            elif not self.gathering:
                                self.gathering = True
                                loop.call_soon(self._burst_read)
                    elif channel == ws_client.STDERR_CHANNEL:
                        self.err_tail = (self.err_tail + data[1:])[-4096:]
                        if b"listening on" in self.err_tail:
                            self.cap.heard_listening = True
                            self.cap.listening.set()
                    elif channel == ws_client.ERROR_CHANNEL:
                        self.status = data[1:]
                    continue
                if kind is aiohttp.WSMsgType.ERROR and not isinstance(msg.data, (OSError, aiohttp.ClientConnectionError)):
                    raise msg.data  # a frame the protocol forbids: the stream cannot be trusted past it
                # CLOSE, CLOSING, CLOSED, or the connection lost
                self.ended = "stopping" if self.stopping else "ran"
                return
        finally:
            # What came before the end (or before an error) is handed on before the end is told.
            self.hand_on()
