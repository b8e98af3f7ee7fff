"""How each capture file is read: the one plan of analyze's captures.

A capture is read through tshark (sources/tshark.py) in one of three ways, decided here from its size, its
kind and what the machine allows (``read_plan``): WHOLE, by one tshark; through the record-level PREPASS
(sources/prepass.py), which hands tshark only the records its display filter may keep; or in CHUNKS of
CHUNK_PACKETS packets split by editcap (sources/captools.py), each read by a fresh tshark. Either way frame
numbers are those of the user's file. Two pcap files or more that share one file header are read together,
interleaved in capture-time order into one tshark (``interleave_header``, sources/interleave.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
import threading

from kubectl_meshdoctor.private_dirs import private_dir_prefix
from kubectl_meshdoctor.sources.captools import complete_frames, split_capture
from kubectl_meshdoctor.sources.fastpath import FastPrepass, fast_prepass, fastpath_wanted
from kubectl_meshdoctor.sources.files import CaptureArg
from kubectl_meshdoctor.sources.interleave import interleavable
from kubectl_meshdoctor.sources.prepass import PrepassResult, prepass
from kubectl_meshdoctor.sources.tshark import MAX_NAMED, ReadResult, read_file

# tshark keeps ~75 bytes of state per frame read (tshark 4.0, our settings) and its -M reset leaks more than it
# frees, so a big file is read in chunks of CHUNK_PACKETS, each by a fresh tshark: memory stays flat whatever
# the file's size (bench/RESULTS.md). editcap (ships with tshark) splits by packet count, so frame numbers of
# the user's file are the chunk's plus the packets before it. A connection whose SYN and answer straddle a chunk
# boundary loses tshark's view of it (tcp.completeness), as with -M.
# With one tshark for several files (JOBS), a chunk is read whole while the time merge holds its events for the
# other file's next chunk: the chunk size bounds that buffer (~0.9 KB a yielded packet, about half of a lo chunk)
# against ~0.3 s of tshark start per chunk. 25k: 1M packets in 41 chunks, +5% memory from 200k to 1M packets
# (50k: +11%); bench/RESULTS.md.
CHUNK_PACKETS = 25_000
CHUNK_ABOVE_BYTES = 16 << 20  # smaller files are read whole: no second copy, no extra tshark start
# Sharing tshark, a file read whole is held whole: split any file that may hold more than CHUNK_PACKETS packets.
# A record takes at least 56 bytes (pcap's 16-byte header, IPv4 and TCP without a link header).
SHARED_CHUNK_ABOVE_BYTES = CHUNK_PACKETS * 56
# tsharks at once. Each holds ~160 MB from its start, ~100 MB of it libwireshark's code and tables, which no
# setting shrinks (no plugins, protocols disabled: bench/RESULTS.md). One tshark dissects while our process
# parses on another core, and the run stays near 220 MB; two read two files ~10% faster, at ~365 MB.
JOBS = 1


# The record-level pre-pass (sources/prepass.py): files above PREPASS_ABOVE_BYTES (None: never) are filtered to
# the records PREFILTER may keep before tshark reads them, in chunks of PREPASS_CHUNK_PACKETS kept records, each
# record renumbered to its frame of the user's file. Below it the pass saves less than one tshark start costs.
# MESHDOCTOR_PREPASS=0 turns it off, =1 on for every file (tests and bench/run compare the two).
PREPASS_ABOVE_BYTES: int | None = 4 << 20
# Kept records a chunk. Nearly every kept record is yielded, and the time merge holds a chunk's events while the
# other file waits for the one tshark: chunks of 25k kept records (~2.5 times the events of a 25k-record chunk
# without the pass) peaked at 277 MB summed RSS at 1M packets, 15k at 242 MB, 12k at 239 MB; each chunk costs
# ~0.2 s of tshark start (bench/RESULTS.md).
PREPASS_CHUNK_PACKETS = 12_000


# The pre-pass's fast path (sources/fastpath.py, fastpath_wanted): the events of kept records without TCP payload
# are made by the pass itself, only the rest go to tshark.
FAST_GATE_EVERY = 4096  # events handed on between two waits at the merge's gate, after tshark's last chunk


def _scratch_usable(parent: str) -> bool:
    """Whether chunks can be written beside the input (``parent``) or in a temporary directory."""
    if os.access(parent, os.W_OK):
        return True
    try:
        tempfile.gettempdir()
    except OSError:
        return False
    return True


def _prepass_wanted(path: str) -> bool:
    env = os.environ.get("MESHDOCTOR_PREPASS")
    if env in ("0", "1"):
        return env == "1"
    return PREPASS_ABOVE_BYTES is not None and os.path.getsize(path) > PREPASS_ABOVE_BYTES


def interleave_header(paths: list[str]) -> bytes | None:
    """The one pcap header under which ``paths`` are read through one tshark (sources/interleave.py), or None
    to read them one by one: two files or more, the pre-pass wanted for them (together over
    PREPASS_ABOVE_BYTES, or MESHDOCTOR_PREPASS=1), and files that can share a stream."""
    env = os.environ.get("MESHDOCTOR_PREPASS")
    if len(paths) < 2 or env == "0":
        return None
    if env != "1" and (PREPASS_ABOVE_BYTES is None or sum(os.path.getsize(p) for p in paths) <= PREPASS_ABOVE_BYTES):
        return None
    return interleavable(paths)


async def _run_prepass(path: str, into: str, fast: bool = False) -> PrepassResult | FastPrepass | None:
    """prepass() (fast_prepass() with ``fast``) in a thread (the event loop, a TUI's screen, goes on); cancelled,
    it is stopped and waited for before the caller removes ``into``, so no chunk is written after."""
    stop = threading.Event()
    per_chunk = min(PREPASS_CHUNK_PACKETS, CHUNK_PACKETS)  # a test's small CHUNK_PACKETS applies here too
    task = asyncio.ensure_future(asyncio.to_thread(fast_prepass if fast else prepass, path, into, per_chunk, stop))
    try:
        return await asyncio.shield(task)
    except BaseException:
        stop.set()
        await asyncio.wait({task})
        raise


WHOLE, PREPASS, CHUNKS = "whole", "prepass", "chunks"  # the ways a capture file is read


def read_plan(path: str, shared: bool) -> tuple[str, ...]:
    """How capture ``path`` is read: the ways to try, in order; the last always reads it. PREPASS first when it
    pays (PREPASS_ABOVE_BYTES, or MESHDOCTOR_PREPASS=1): it gives up on a file it does not follow. Then CHUNKS
    (editcap) for a file over CHUNK_ABOVE_BYTES (over SHARED_CHUNK_ABOVE_BYTES when ``shared``: fewer tshark
    slots than files), else WHOLE. Both write beside the input when we may (the same disk, not a RAM-backed
    /tmp), else in TMPDIR; with neither, the file is read whole by one tshark (slower on a big file, the same
    findings)."""
    scratch = _scratch_usable(os.path.dirname(os.path.abspath(path)))
    first = (PREPASS,) if _prepass_wanted(path) and scratch else ()
    big = os.path.getsize(path) > (SHARED_CHUNK_ABOVE_BYTES if shared else CHUNK_ABOVE_BYTES)
    return first + ((CHUNKS,) if big and shutil.which("editcap") and scratch else (WHOLE,))


async def read_capture(a: CaptureArg, slots: asyncio.Semaphore, shared: bool, on_event, gate) -> ReadResult:
    """Read capture ``a`` into ``on_event`` with one tshark slot of ``slots``, as ``read_plan`` says; each
    chunk's frames renumbered back to the file's own. ``gate`` is the merge's turn-taking (sources/merge.py).
    Returns what tshark read, with ``frames_read`` the frames of the user's file."""
    # ``shared``: fewer tshark slots than files. A reader then reads a whole chunk once it holds a slot (the
    # merge buffers it) and waits its turn in capture time only between chunks: a reader holding the slot while
    # shut at the gate would wait for packets of another file that no tshark can read.
    async def read(path: str, offset: int = 0, frame_map=None, sink=on_event) -> ReadResult:
        await gate()
        async with slots:
            return await read_file(path, a.path, a.iface, sink, force_iface=a.explicit,
                                   gate=None if shared else gate, frame_offset=offset, frame_map=frame_map)

    *first, last = read_plan(a.path, shared)
    parent = os.path.dirname(os.path.abspath(a.path))
    if PREPASS in first:
        with tempfile.TemporaryDirectory(prefix=private_dir_prefix("chunks"),  # mode 0700: the capture's bytes
                                         dir=parent if os.access(parent, os.W_OK) else None) as tmp:
            fast = fastpath_wanted()
            kept = await _run_prepass(a.path, tmp, fast)
            if isinstance(kept, FastPrepass):
                return await _read_fast(kept, a, read, on_event, gate)
            if kept is not None:
                return await _read_kept(kept, read)
        # A file the pre-pass does not follow: read as without it.
    if last == WHOLE:
        return await read(a.path)
    with tempfile.TemporaryDirectory(prefix=private_dir_prefix("chunks"),  # mode 0700: the chunks are the capture
                                     dir=parent if os.access(parent, os.W_OK) else None) as tmp:
        return await _read_chunks(a.path, tmp, read)


async def _read_chunks(path: str, into: str, read) -> ReadResult:
    """Split ``path`` into chunks of CHUNK_PACKETS in directory ``into`` and read them in order, each chunk's
    frames offset by the packets before it."""
    chunks, complaint = await split_capture(path, into, CHUNK_PACKETS)
    packets = last = frames = skipped = 0
    named: tuple[int, ...] = ()
    error = None
    for i, chunk in enumerate(chunks):
        offset = i * CHUNK_PACKETS  # every chunk but the last holds exactly CHUNK_PACKETS
        r = await read(chunk, offset)
        # io,stat prints no row for a chunk of one instant: its whole records are then counted here.
        whole = r.frames_read if r.frames_read is not None else await asyncio.to_thread(complete_frames, chunk)
        os.unlink(chunk)
        packets += r.packets
        last = r.last_frame or last
        frames = offset + (whole if whole is not None else max(r.last_frame - offset, 0))
        error = r.error or error
        skipped += r.undissectable
        named = (named + r.undissectable_frames)[:MAX_NAMED]
    cut = bool(complaint and "cut short" in complaint)
    return ReadResult(packets, last, cut, error or (None if cut else complaint), frames, None, skipped, named)


async def _read_kept(kept: PrepassResult, read) -> ReadResult:
    """Read the pre-pass's chunks in order, each through its map to the file's frame numbers."""
    packets = last = skipped = 0
    named: tuple[int, ...] = ()
    error = None
    for chunk in kept.chunks:
        r = await read(chunk.path, frame_map=chunk.frames)
        os.unlink(chunk.path)
        packets += r.packets
        last = r.last_frame or last
        error = r.error or error
        skipped += r.undissectable
        named = (named + r.undissectable_frames)[:MAX_NAMED]
    # The pass wrote no record cut off by the file's end: such a cut is its finding, not tshark's.
    return ReadResult(packets, last, kept.cut_short, error, kept.records, None, skipped, named)


async def _read_fast(kept: FastPrepass, a: CaptureArg, read, on_event, gate) -> ReadResult:
    """The fast path's events and tshark's of the records left to it, merged in frame order into ``on_event``:
    the stream the detectors see without the fast path. ``gate`` is awaited between batches of the events
    after tshark's last chunk."""
    events = kept.events.events(a.path, a.iface, a.explicit)
    ahead = next(events, None)
    fast = last = 0

    def merged(ev) -> None:
        nonlocal ahead, fast, last
        while ahead is not None and ahead.frame < ev.frame:
            on_event(ahead)
            fast, last = fast + 1, ahead.frame
            ahead = next(events, None)
        on_event(ev)

    r = await _read_kept(kept.result, lambda path, frame_map: read(path, frame_map=frame_map, sink=merged))
    while ahead is not None:
        on_event(ahead)
        fast, last = fast + 1, ahead.frame
        ahead = next(events, None)
        if not fast % FAST_GATE_EVERY:
            await gate()
    return dataclasses.replace(r, packets=r.packets + fast, last_frame=max(r.last_frame, last))
