"""One pod's live capture, from its start to what it came to (``LiveRun``): a tcpdump exec stream an interface
(live/pod_script.py), each moved by a pump (live/pump.py) into the watch's shared dissector (live/dissect.py)
or, with ``--dissect pod``, read as the pod's tshark lines (live/pod_fields.py); copies kept where asked
(live/capture_copy.py).

Blocking calls run in worker threads, so the caller's event loop (the TUI's) never stalls on them. One stream
lost (or one tcpdump ended) is reported and the other interfaces keep capturing: a collision on eth0 is
evidence whether or not lo is still seen. The capture ends when every stream has.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Problem, payload_cut_problem, undissectable_problem
from kubectl_meshdoctor.core.report_model import CaptureCounts
from kubectl_meshdoctor.kube.client import Kube

from .capture_copy import pcap_path
from .dissect import SharedDissector, Stream
from .pod_fields import PodFieldStream, pod_tshark_args
from .pod_script import FULL_FILTER, lean_filter, without_admin
from .pump import ExecCapture

LISTEN_TIMEOUT_S = 30.0
READ_GRACE_S = 30.0  # how long each tshark may go on reading after the capture was stopped


@dataclass(frozen=True, slots=True)
class CapturePlan:
    """How a pod is captured: on ``ifaces``, by tcpdumps that end by themselves after ``max_seconds``;
    ``dissect`` "local" (tcpdump's pcap crosses the exec stream into the watch's one tshark) or "pod" (each
    stream's tshark runs in the debug container and only its lines cross: no pcap bytes here, so neither
    ``write_pcap_dir`` nor ``spool_dir``). ``write_pcap_dir`` keeps the raw captures (on request: they carry
    secrets), replacing files of the same name with ``overwrite_pcap`` (never a link); ``spool_dir`` a
    private copy of at most ``spool_limit`` bytes a stream, its owner's to delete. ``full_capture``: every TCP
    packet, not only what the detectors read; ``admin_port``: the sidecar's Envoy admin, left out on lo."""

    ifaces: tuple[str, ...]
    max_seconds: int
    dissect: str = "local"
    write_pcap_dir: Path | None = None
    overwrite_pcap: bool = False
    spool_dir: Path | None = None
    spool_limit: int = 1 << 30
    full_capture: bool = False
    admin_port: int = 15000


@dataclass(slots=True)
class CaptureState:
    """What a front end may show of a pod's capture while it goes on."""

    phase: str = "starting"
    captures: list[ExecCapture] = field(default_factory=list)
    pcap_files: dict[str, str] = field(default_factory=dict)
    spool_files: dict[str, str] = field(default_factory=dict)  # iface -> the spool copy (CapturePlan.spool_dir)
    tshark_errors: dict[str, str] = field(default_factory=dict)  # iface -> what went wrong with its tshark
    # "iface: why" for each stream or tshark that went wrong, in the order they ended (shown while the run goes on)
    stream_problems: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """What a pod's capture came to: ``captures`` by interface (tcpdump's ``captured`` and
    ``dropped_by_kernel``, tshark's ``frames_read``, the stream's ``bytes``), ``frames_read`` by interface
    where tshark said, its ``problems`` in interface order, and ``captured_nothing``: no tcpdump ever said
    "listening on" (no such device, no tcpdump, every exec refused), or every stream was lost on the way before
    a frame was read. An idle pod, one stream of several lost, or a pod deleted after its packets were read,
    still had a capture."""

    captures: dict[str, CaptureCounts]
    frames_read: dict[str, int]
    problems: list[Problem]
    captured_nothing: bool


class LiveRun:
    """One pod's capture: ``start`` it, ``wait`` while it runs, ``stop`` it (always: every tcpdump is then
    stopped and every reader done), and read its ``report``. Packets go to ``feed`` on the event loop; ``state``
    shows the run while it goes on; ``dissector`` is the watch's one tshark (unused with ``dissect`` "pod")."""

    def __init__(self, kube: Kube, pod, container: str, plan: CapturePlan, feed: Callable[[PacketEvent], None],
                 state: CaptureState, dissector: SharedDissector, stop: asyncio.Event,
                 progress: Callable[[str], None]) -> None:
        self.kube, self.pod, self.container, self.plan = kube, pod, container, plan
        self.feed, self.state, self.dissector, self.stop_event, self.progress = feed, state, dissector, stop, progress
        self.pod_name: str = pod.metadata.name
        self.streams: list[Stream | PodFieldStream] = []
        self.readers: list[asyncio.Future] = []  # each stream's ReadResult
        self.ended: list[asyncio.Future] = []  # each stream over: its pump has ended
        self.results: list = []

    async def start(self) -> None:
        """Start a tcpdump exec stream an interface, and wait until each says it listens (LISTEN_TIMEOUT_S at
        most: one that never does is reported when its stream ends)."""
        self._start_captures()
        self.readers = [s.result for s in self.streams]
        for cap, ended, reader in zip(self.state.captures, self.ended, self.readers):
            ended.add_done_callback(functools.partial(self._pump_done, cap))
            reader.add_done_callback(functools.partial(self._reader_done, cap))
        self.progress(f"waiting for tcpdump on {', '.join(self.plan.ifaces)} in pod/{self.pod_name} "
                      f"({self.container})")
        await asyncio.to_thread(_wait_listening, self.state.captures, LISTEN_TIMEOUT_S)

    async def wait(self, duration_s: float | None) -> None:
        """Until ``duration_s`` seconds pass (None: no limit), the watch's stop is set, or every stream has
        ended."""
        self.progress(f"capturing {', '.join(self.plan.ifaces)} in pod/{self.pod_name} via {self.container}")
        waits = [asyncio.create_task(self.stop_event.wait())]
        if self.ended:
            waits.append(asyncio.create_task(asyncio.wait(self.ended)))  # cancelling it never cancels the readers
        try:
            await asyncio.wait(waits, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def stop(self) -> None:
        """Stop every tcpdump; each stream ends and its tshark reads to the end. One that stopped reading
        (stalled) would hold the report up for ever, and its full pipe the capture thread: it is killed after
        READ_GRACE_S instead. The watch's tshark may also read other pods' streams, still capturing: what
        counts is that it reads."""
        state, readers = self.state, self.readers
        state.phase = "stopping"
        for cap in state.captures:
            cap.stop()
        if self.plan.dissect == "pod":  # each result comes when its pump has ended (in STOP_GRACE_S at most)
            if readers:
                await asyncio.wait(readers, timeout=READ_GRACE_S)
            late = {r for r in readers if not r.done()}
        else:
            settled = await self.dissector.settle(self.streams, READ_GRACE_S)
            late = set() if settled else {r for r in readers if not r.done()}
            if late:
                self.dissector.abandon()
        for cap, reader in zip(state.captures, readers):
            if reader in late or (self.dissector.abandoned and reader.cancelled()):
                why = (f"tshark still reading {READ_GRACE_S:.0f} s after the capture was stopped: killed; the "
                       f"rest of pod/{self.pod_name}/{cap.iface} was not analysed")
                state.tshark_errors[cap.iface] = why
                state.stream_problems.append(f"{cap.iface}: {why}")
                reader.cancel()
        for cap in state.captures:
            await asyncio.to_thread(cap.join, 30.0)
        self.results = await asyncio.gather(*readers, return_exceptions=True)
        state.phase = "done"

    def report(self) -> CaptureReport:
        """What the capture came to, once ``stop`` has returned."""
        state = self.state
        captures: dict[str, CaptureCounts] = {}
        frames_read: dict[str, int] = {}
        problems: list[Problem] = []
        for cap, res in zip(state.captures, self.results):
            where = f"pod/{self.pod_name} {cap.iface}"
            if cap.error:
                problems.append(Problem(where, cap.error))
            if cap.tee_error and cap.tee_path in state.pcap_files.values():  # a spool's is the TUI's to say
                problems.append(Problem(where, cap.tee_error))
            if cap.iface in state.tshark_errors:
                problems.append(Problem(where, state.tshark_errors[cap.iface]))
            if cap.dropped_by_kernel:
                problems.append(Problem(where, f"tcpdump: {cap.dropped_by_kernel} packets dropped by kernel"))
            read = None if isinstance(res, BaseException) else res.frames_read
            if read is not None:
                frames_read[cap.iface] = read
            captures[cap.iface] = CaptureCounts(cap.captured, cap.dropped_by_kernel, read, cap.bytes_received)
            if cap.captured is not None and read is not None and read < cap.captured:
                problems.append(Problem(where, f"{cap.captured - read} of {cap.captured} captured packets were not "
                                               f"read by tshark"))
            if not isinstance(res, BaseException) and res.undissectable:
                problems.append(undissectable_problem(where, res.undissectable, res.undissectable_frames))
            if not isinstance(res, BaseException) and res.payload_cut:
                problems.append(payload_cut_problem(where, res.payload_cut))
        # Scripts read the exit code, not the problems: a capture of nothing must say so.
        nothing = not any(cap.heard_listening for cap in state.captures) or (
            bool(state.captures) and all(cap.failed for cap in state.captures)
            and not any(c.frames_read for c in captures.values()))
        return CaptureReport(captures, frames_read, problems, nothing)

    def _start_captures(self) -> None:
        """One tcpdump exec stream an interface, each pumped into a Stream of the dissector (or, with dissect
        "pod", a PodFieldStream of its tshark's lines); a future an interface in ``ended``, done when its pump
        has ended."""
        plan, state, pod_name = self.plan, self.state, self.pod_name
        loop = asyncio.get_running_loop()
        in_pod = plan.dissect == "pod"
        for iface in plan.ifaces:
            source = f"{pod_name}/{iface}"
            stream = (PodFieldStream(source, iface, self.feed, loop) if in_pod
                      else self.dissector.stream(source, iface, self.feed))
            self.streams.append(stream)
            tee, limit = None, None
            if in_pod:
                pass  # no pcap bytes come: nothing to keep
            elif plan.write_pcap_dir is not None:
                plan.write_pcap_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # a pod's own: owner-only
                tee = str(pcap_path(plan.write_pcap_dir, pod_name, iface))
                state.pcap_files[iface] = tee
            elif plan.spool_dir is not None:
                tee, limit = str(pcap_path(plan.spool_dir, pod_name, iface)), plan.spool_limit
                state.spool_files[iface] = tee
            bpf = FULL_FILTER if plan.full_capture else lean_filter(iface)
            if iface == "lo":
                bpf = without_admin(bpf, plan.admin_port)
            cap = ExecCapture(self.kube, self.pod.metadata.namespace, pod_name, self.container, iface,
                              plan.max_seconds, -1, tee, limit,
                              tee_replace=plan.overwrite_pcap or plan.write_pcap_dir is None,  # a spool is ours
                              bpf=bpf, tshark_args=pod_tshark_args() if in_pod else None)
            done = loop.create_future()
            self.ended.append(done)
            cap.on_data = stream.wrote
            cap.on_end = functools.partial(_pump_ended, stream, loop, done)
            state.captures.append(cap)
            cap.start()

    def _pump_done(self, cap: ExecCapture, _: asyncio.Future) -> None:
        """``cap``'s stream is over; the dissector goes on with the others: say so, with why."""
        if cap.error:
            self.state.stream_problems.append(f"{cap.iface}: {cap.error}")
        going = [c.iface for c, e in zip(self.state.captures, self.ended) if not e.done()]
        if not cap.stop_asked and not self.stop_event.is_set() and going:
            self.progress(f"capturing {', '.join(going)} in pod/{self.pod_name} via {self.container}; {cap.iface} "
                          f"ended: {cap.error or 'tcpdump exited'}")

    def _reader_done(self, cap: ExecCapture, reader: asyncio.Future) -> None:
        """tshark is done with ``cap``'s stream: say what went wrong at once, and if tshark went first (killed,
        crashed) end tcpdump in the pod too, rather than stream into a broken pipe while the others go on."""
        asked = cap.stop_asked  # by us: --duration passed, or the user stopped
        cap.stop()
        why = tshark_trouble(cap, reader, asked, self.stop_event.is_set())
        if why:
            self.state.tshark_errors[cap.iface] = why
            self.state.stream_problems.append(f"{cap.iface}: {why}")
            if not asked and not self.stop_event.is_set():
                self.progress(f"pod/{self.pod_name} {cap.iface}: {why}; its capture is stopped")


def tshark_trouble(cap: ExecCapture, reader: asyncio.Future, stop_asked: bool, user_stopped: bool) -> str | None:
    """One line on what went wrong with the tshark that read ``cap``'s stream (``reader``, done), or None.

    After a user's Ctrl-C (``user_stopped``) the terminal signals tshark too: its death by SIGINT, or a crash
    report then, is the stop and not a fault; a SIGKILL or SIGSEGV still is."""
    if reader.cancelled():
        return None
    exc = reader.exception()
    if exc is not None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None if user_stopped else f"tshark failed: {reason}"
    res = reader.result()
    if not res.error:
        return None
    if res.killed_by is not None:
        return None if user_stopped and res.killed_by == signal.SIGINT else f"tshark: {res.error}"
    if user_stopped:
        return None
    # tshark's complaints at the end of its input (cut short, not a capture file) follow from how the stream
    # ended: cap.error, set before that end reached tshark, says why when it was lost, and a stream we closed
    # ourselves (no half-close before v5) may end mid-record.
    return None if cap.error or stop_asked else f"tshark: {res.error}"


def _wait_listening(captures: list[ExecCapture], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for cap in captures:
        cap.listening.wait(max(0.0, deadline - time.monotonic()))


def _pump_ended(stream: Stream | PodFieldStream, loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> None:
    """From a pump's thread: its stream is over; mark ``fut`` done on ``loop`` (nothing if the loop has closed)."""
    stream.ended()
    try:
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))
    except RuntimeError:
        pass
