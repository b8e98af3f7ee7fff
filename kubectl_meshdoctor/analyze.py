"""Offline analysis: capture files through the same pipeline as a live capture."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .pipeline import Pipeline
from .report import Report
from .sources.merge import merge_by_time
from .sources.tshark import ReadResult, read_file

# pcap (both byte orders, micro- and nanosecond), pcapng section header block.
_MAGICS = (b"\xa1\xb2\xc3\xd4", b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1", b"\x0a\x0d\x0d\x0a")


class InputError(Exception):
    """A capture argument that cannot be read; the message is one line for stderr."""


@dataclass(frozen=True, slots=True)
class CaptureArg:
    """``FILE`` or ``FILE:IFACE`` from the command line; ``iface`` defaults to the file's stem (``lo.pcap`` -> lo)."""

    path: str
    iface: str
    explicit: bool = False  # the user named the interface: it applies to every packet of the file

    @classmethod
    def parse(cls, arg: str) -> "CaptureArg":
        if ":" in arg and not os.path.exists(arg):
            head, _, tail = arg.rpartition(":")
            if head and re.fullmatch(r"[A-Za-z0-9_.@-]{1,15}", tail):
                return cls(head, tail, explicit=True)
        return cls(arg, iface_from_name(arg))


def iface_from_name(path: str) -> str:
    """The interface a file name suggests: ``lo.pcap`` -> lo, ``reviews-eth0.pcap`` -> eth0 (the names
    ``watch --write-pcap`` gives), otherwise the stem itself."""
    stem = Path(path).name.split(".")[0] or "unknown"
    last = re.split(r"[-_]", stem)[-1]
    return last if re.fullmatch(r"lo|any|eth\d+|net\d+|en[a-z0-9]+|veth\w*", last) else stem


def check_capture(path: str) -> None:
    """Raise InputError unless ``path`` is a readable pcap or pcapng file."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a capture file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if magic not in _MAGICS:
        raise InputError(f"{path}: not a pcap or pcapng capture (tcpdump -w / Wireshark format expected)")


def complete_frames(path: str) -> int | None:
    """How many whole frames a capture holds, by capinfos (ships with tshark); None when it cannot tell."""
    try:
        out = subprocess.run(["capinfos", "-M", "-c", "-r", "-T", path], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\t(\d+)\s*$", out.strip())
    return int(m.group(1)) if m else None


async def _reader(a: CaptureArg, on_event, gate) -> ReadResult:
    return await read_file(a.path, a.path, a.iface, on_event, force_iface=a.explicit, gate=gate)


async def analyze(args: list[CaptureArg], pipeline: Pipeline) -> Report:
    """Run every capture through ``pipeline`` and build the report. Raises InputError for unreadable input."""
    for a in args:
        check_capture(a.path)
    problems: list[dict] = []
    readers = [functools.partial(_reader, a) for a in args]
    results = await merge_by_time(readers, pipeline.feed)
    for a, result in zip(args, results):
        if isinstance(result, BaseException):
            raise result
        if result.frames_read is not None:
            pipeline.stats.frames_read[a.path] = result.frames_read
        if result.cut_short:
            whole = complete_frames(a.path)
            last = whole if whole is not None else result.last_frame
            problems.append({"where": a.path, "what": f"capture cut short in the middle of a packet after frame "
                                                      f"{last}; analysed up to there", "cut_after_frame": last})
        elif result.error:
            problems.append({"where": a.path, "what": f"tshark: {result.error}"})
    findings = pipeline.finish()
    return Report({"kind": "pcap", "files": [a.path for a in args]}, pipeline.stats, findings, problems)
