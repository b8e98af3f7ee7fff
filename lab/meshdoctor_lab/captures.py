"""tcpdump on lab interfaces for a block of code: the evidence recorder's captures (and the tests' that read them).

Each capture is real tcpdump in a network namespace, started and listening ("listening on" on its stderr) before
the block runs, stopped with SIGINT after it (tcpdump then writes out what it holds) and waited for. It captures
TCP only, and leaves out the admin port (127.0.0.1:15000): the recorder's own admin requests are not the round's.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from meshdoctor_lab.netns import in_netns
from meshdoctor_lab.state import LabError

# -B 32768 (KiB): with --immediate-mode libpcap's ring holds frames of the snap length, 8 of them in the default
# 2 MiB, and a tcpdump starved by a busy machine lost packets mid-connection. -c bounds a capture that runs away.
TCPDUMP_OPTIONS = ("-n", "-B", "32768", "-U", "--immediate-mode", "-c", "20000")
CAPTURE_FILTER = "tcp and not port 15000"
LISTENING_WITHIN_S = 10.0
STOP_WITHIN_S = 10.0


@dataclass(frozen=True)
class Interface:
    """An interface to capture: its network namespace and name (``lo``, ``eth0``)."""

    netns: str
    iface: str


@contextlib.contextmanager
def capturing(interfaces: Mapping[Path, Interface]) -> Iterator[None]:
    """tcpdump on each interface into its pcap path for the block; the files are complete on exit.

    Raises LabError when a tcpdump does not start listening within LISTENING_WITHIN_S seconds (or exits)."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for pcap, where in interfaces.items():
            pcap.parent.mkdir(parents=True, exist_ok=True)
            err = pcap.with_name(pcap.name + ".stderr")
            with open(err, "wb") as err_file:
                procs.append((subprocess.Popen(
                    in_netns(where.netns, "tcpdump", "-i", where.iface, *TCPDUMP_OPTIONS, "-w", str(pcap),
                             CAPTURE_FILTER),
                    stdout=subprocess.DEVNULL, stderr=err_file), err))
        deadline = time.monotonic() + LISTENING_WITHIN_S
        for proc, err in procs:
            while b"listening on" not in err.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise LabError(f"tcpdump for {err.name} did not start: "
                                   f"{err.read_text(errors='replace').strip()[:200] or 'no output'}")
                time.sleep(0.02)
        yield
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, err in procs:
            try:
                proc.wait(timeout=STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_WITHIN_S)
            err.unlink(missing_ok=True)
