"""tcpdump in the debug container, its pcap byte stream carried over the exec websocket into a local pipe.

The official client's websocket is synchronous, so each stream is pumped by its own thread into an OS pipe
whose read end tshark consumes; a slow consumer blocks the pump, which is the back-pressure we want (the
kernel then counts drops, which tcpdump reports on exit) rather than unbounded buffering here.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field

from kubernetes.stream import stream as k8s_stream
from kubernetes.stream import ws_client

from .client import Kube, api_error_message

# The capture runs under a dead-man's switch: a watchdog reads the exec stdin (saved on fd 3, because sh gives
# background jobs /dev/null as stdin) and SIGINTs tcpdump when stdin closes, which happens when we half-close it
# on exit or when our websocket dies with us. `exec` keeps the shell's pid, so $$ is tcpdump's. SIGINT lets
# tcpdump flush its last packets and print its drop counts. `timeout` bounds it even if stdin never closes.
CAPTURE_SCRIPT = (
    'exec 3<&0; '
    '( cat <&3 >/dev/null 2>&1; kill -INT $$ 2>/dev/null ) >/dev/null 2>&1 & '
    'exec timeout -s INT "$1" tcpdump -i "$2" -p -n -s 262144 --immediate-mode -U -w - "$3"'
)
DEFAULT_FILTER = "tcp"
STOP_GRACE_S = 10.0  # how long tcpdump may take to flush and exit after we asked it to stop


def capture_command(iface: str, max_seconds: int, bpf: str = DEFAULT_FILTER) -> list[str]:
    """argv for the exec: tcpdump on ``iface`` for at most ``max_seconds``, pcap on stdout."""
    return ["sh", "-c", CAPTURE_SCRIPT, "meshdoctor-capture", str(int(max_seconds)), iface, bpf]


@dataclass(slots=True)
class ExecCapture:
    """One tcpdump exec stream pumped into ``write_fd`` by a thread; ``tee_path`` keeps a copy on request.

    After ``join``: ``returncode`` is tcpdump's exit status (None if the stream was lost), ``stderr`` its last
    lines, ``dropped_by_kernel`` the count it reported, ``error`` a one-line reason the stream ended early.
    """

    kube: Kube
    namespace: str
    pod: str
    container: str
    iface: str
    max_seconds: int
    write_fd: int
    tee_path: str | None = None
    bytes_received: int = 0
    returncode: int | None = None
    stderr: str = ""
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.pod}-{self.iface}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask tcpdump to finish (stdin EOF -> SIGINT in the pod); the pump drains what it flushes."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def dropped_by_kernel(self) -> int | None:
        m = re.search(r"(\d+) packets? dropped by kernel", self.stderr)
        return int(m.group(1)) if m else None

    def _run(self) -> None:
        tee = open(self.tee_path, "wb") if self.tee_path else None
        ws = None
        try:
            ws = k8s_stream(
                self.kube.core.connect_get_namespaced_pod_exec, self.pod, self.namespace,
                container=self.container, command=capture_command(self.iface, self.max_seconds),
                stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
            )
            # stream() in client v37 does not pass capture_all through; without this the client keeps a copy of
            # every captured byte for read_all() and memory grows with the capture.
            ws._all = ws_client._IgnoredIO()
            self.started.set()
            stop_sent = False
            stop_deadline = 0.0
            err_tail = b""
            while ws.is_open():
                if stop_sent and time.monotonic() > stop_deadline:
                    self.error = f"tcpdump on {self.iface} did not stop within {STOP_GRACE_S:.0f} s; stream closed"
                    break
                if self._stop.is_set() and not stop_sent:
                    stop_sent = True
                    stop_deadline = time.monotonic() + STOP_GRACE_S
                    if ws.subprotocol == ws_client.V5_CHANNEL_PROTOCOL:
                        ws.close_channel(ws_client.STDIN_CHANNEL)  # stdin EOF: the watchdog SIGINTs tcpdump
                    else:
                        break  # no half-close before v5: closing the stream closes stdin too
                ws.update(timeout=0.2)
                err_tail = self._drain(ws, tee, err_tail)
            err_tail = self._drain(ws, tee, err_tail)
            self.stderr = err_tail.decode("utf-8", "replace")
            if not ws.is_open():
                try:
                    self.returncode = ws.returncode
                except Exception:  # no status frame: the stream was cut, not ended
                    self.returncode = None
            if self.returncode is None and not self._stop.is_set():
                self.error = f"capture stream on {self.iface} ended without an exit status (connection lost)"
            elif self.returncode not in (None, 0) and not self._stop.is_set():
                last = self.stderr.strip().splitlines()[-1:] or [f"exit code {self.returncode}"]
                self.error = f"tcpdump on {self.iface} failed: {last[0]}"
        except Exception as e:  # the API refused the exec or the connection broke: report, never lose silently
            self.error = f"capture stream on {self.iface}: {api_error_message(e)}"
        finally:
            self.started.set()
            if ws is not None:
                try:
                    ws.close()
                except Exception:
                    pass
            if tee is not None:
                tee.close()
            os.close(self.write_fd)  # EOF for tshark

    def _drain(self, ws, tee, err_tail: bytes) -> bytes:
        out = ws.read_channel(ws_client.STDOUT_CHANNEL)
        if out:
            self.bytes_received += len(out)
            if tee is not None:
                tee.write(out)
                tee.flush()
            view = memoryview(out)
            while view:
                try:
                    n = os.write(self.write_fd, view)
                except BrokenPipeError:  # tshark went away; keep draining so tcpdump is not blocked
                    break
                view = view[n:]
        err = ws.read_channel(ws_client.STDERR_CHANNEL)
        if err:
            err_tail = (err_tail + err)[-4096:]
        return err_tail
