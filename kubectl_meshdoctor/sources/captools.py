"""The capture tools that ship with tshark, run on a capture file: capinfos (what a file holds) and editcap (a
large file split into chunks of a number of packets)."""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
from dataclasses import dataclass

from kubectl_meshdoctor.children import dying_with_us
from kubectl_meshdoctor.pcap_header import capture_suffix


@dataclass(frozen=True, slots=True)
class CaptureSummary:
    """What capinfos (ships with tshark) tells of a capture file: Wireshark's name of its ``file_type`` ("pcap",
    "pcapng"; "mime" for a pcapng cut inside its first blocks, read as one frame of the file's own bytes),
    its whole ``frames``, and the ``data_bytes`` of packets they hold (0 for records of no byte: zeros after a
    pcap header read so)."""

    file_type: str
    frames: int
    data_bytes: int


def capture_summary(path: str) -> CaptureSummary | None:
    """One capinfos run over ``path``; None when it cannot tell."""
    try:
        out = subprocess.run(["capinfos", "-M", "-r", "-T", "-t", "-c", "-d", path], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = out.strip().rsplit("\t", 3)  # the path first, which may hold a TAB itself
    if len(fields) != 4 or not fields[2].isdigit() or not fields[3].isdigit():
        return None
    return CaptureSummary(fields[1].lower(), int(fields[2]), int(fields[3]))


def complete_frames(path: str) -> int | None:
    """How many whole frames a capture holds, by capinfos; None when it cannot tell."""
    summary = capture_summary(path)
    return summary.frames if summary is not None else None


async def split_capture(path: str, into: str, packets: int) -> tuple[list[str], str | None]:
    """editcap -c ``packets``: the chunk files (in directory ``into``) in order, and editcap's complaint (a file
    cut short) if any. editcap dies with us (kubectl_meshdoctor/children.py)."""
    with open(path, "rb") as fh:
        ext = capture_suffix(fh.read(4))
    # editcap writes the whole file before any chunk is read; the event loop (a TUI's screen) goes on meanwhile.
    proc = await asyncio.create_subprocess_exec("editcap", "-c", str(packets), path,
                                                os.path.join(into, "chunk" + ext),
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                preexec_fn=dying_with_us())
    try:
        _, err = await proc.communicate()
    except BaseException:
        # Cancelled (Ctrl-C, SIGTERM): editcap must be gone before the caller removes the directory, or it goes
        # on writing chunks into it (a thread running it could not be stopped, and left the directory behind).
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        raise
    lines = err.decode(errors="replace").strip().splitlines()
    return sorted(glob.glob(os.path.join(into, "chunk_*"))), (lines[-1] if lines else None)
