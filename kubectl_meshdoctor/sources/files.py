"""Capture files as a source: the FILE[:IFACE] arguments, their checks, and reading them through tshark, in
chunks when large (editcap), with frame numbers as Wireshark shows them for the whole file."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import glob
import gzip
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import zlib
import threading
from dataclasses import dataclass
from pathlib import Path

from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.envoy.component_log import parse_component_stages
from kubectl_meshdoctor.envoy.log_format import LogFormat
from kubectl_meshdoctor.envoy.stats_prometheus import looks_like_prometheus
from kubectl_meshdoctor.envoy.wrappers import unwrap, unwrap_layers
from kubectl_meshdoctor.private_dirs import PRIVATE_KINDS, private_dir_prefix, remove_stale_private_dirs  # noqa: F401
from kubectl_meshdoctor.sources.envoy_files import text_encoding
from kubectl_meshdoctor.sources.interleave import interleavable
from kubectl_meshdoctor.sources.prepass import PrepassResult, prepass
from kubectl_meshdoctor.sources.tshark import MAX_NAMED, ReadResult, read_file

# pcap (both byte orders, micro- and nanosecond), pcapng section header block.
_MAGICS = (b"\xa1\xb2\xc3\xd4", b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1", b"\x0a\x0d\x0d\x0a")


class InputError(Exception):
    """An input file that cannot be read, or of no known kind; the message is one line for stderr."""


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


# What a file given to analyze holds, told by its content (its name may say anything).
# ENVOY_LOG: an istio-proxy or Envoy log, its access-log lines, Envoy's own (component) lines, or both.
CAPTURE, ENVOY_LOG, STATS, CLUSTERS = "capture", "envoy-log", "stats", "clusters"
SNIFF_BYTES = 1 << 20  # an istio-proxy log starts with pilot-agent's lines; its first access-log line is near
# Lines of pilot-agent or Envoy itself (`2026-12-01T10:00:00.1Z\tinfo\t...`, `[2026-12-01 10:00:00.1][15][info]`):
# an istio-proxy container log, even one with no access-log line in its head.
_PROXY_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S*\s+(info|warn|warning|error|debug|trace)\s"
                             r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\]\[\d+\]\[\w+\])")
_CLUSTERS_TEXT_LINE = re.compile(r"^[^\s:]+::[^:]+::")  # cluster::host::stat::value, cluster::setting::value
# A line of Envoy's text /stats: a dotted stat name, then a counter or gauge, a text readout or a histogram.
_STAT_NAME = re.compile(r'[^\s"{}<>\[\]]+')
_STAT_VALUE = re.compile(r'\d+$|"|P0\(|No recorded values')


def _stats_line(line: str) -> bool:
    """Whether ``line`` reads as one of Envoy's text /stats: a dotted stat name, ": ", then a counter or gauge, a
    text readout or a histogram. Split at the first ": " rather than matched whole: a regex that must find the
    dot in a line of megabytes with no ": " backtracks over every split of it."""
    name, sep, value = line.partition(": ")
    return bool(sep) and "." in name and _STAT_NAME.fullmatch(name) is not None and _STAT_VALUE.match(value) is not None
# What only Envoy's own stats start with (a dump filtered with ?filter= still has one): `Name: value` text of
# another program's (/proc/net/snmp, a mail header, YAML) is no dump.
_ENVOY_STAT_ROOT = re.compile(r"^(?:cluster|cluster_manager|listener|listener_manager|http|server|runtime|"
                              r"tcp|vhost|control_plane|sds|tls_inspector|workers|overload|main_thread|"
                              r"filesystem|istio|istiocustom|wasm|envoy|http1|http2|dns_cache|udp)\.")


def _regular(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):
        # Reading the magic from a pipe would take those bytes from tshark, which then finds nothing.
        raise InputError(f"{path}: not a regular file (a pipe or device); save it to a file first")


def _gunzip_head(path: str) -> bytes:
    """The first SNIFF_BYTES that decompress from gzip file ``path``: all there is of one cut short or with a
    wrong checksum (its lines are read up to there: sources/envoy_files.py), an error only when none does. The
    file's last 8 bytes, a member's trailer (CRC-32 and size, RFC 1952 section 2.2), are not fed: a wrong
    checksum then costs nothing of what came before it."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the gzip container
    out = b""
    with open(path, "rb") as fh:
        chunk = fh.read(1 << 16)
        while chunk and len(out) < SNIFF_BYTES:
            following = fh.read(1 << 16)
            data = chunk if following else chunk[:-8]
            try:
                out += inflate.decompress(inflate.unconsumed_tail + data, SNIFF_BYTES - len(out))
            except zlib.error:
                if out:
                    break
                raise
            if inflate.eof:
                break
            chunk = following
    return out


def _head(path: str) -> bytes:
    """The first SNIFF_BYTES of ``path``, decompressed when it is gzip (tshark reads gzipped captures)."""
    _regular(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = _gunzip_head(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:  # zlib: a .gz whose data is not deflate
        raise InputError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return head


def input_kind(path: str, log_format: LogFormat | None = None) -> str:
    """What ``path`` holds, by its content: CAPTURE (pcap or pcapng, also gzipped), ENVOY_LOG (an Envoy
    access log in any format Istio or Envoy shipped, or ``log_format``, TEXT or JSON; Envoy's own component
    log in any of its shapes; or an istio-proxy container log holding either; wrapped or not: `kubectl logs
    --timestamps/--prefix`, stern, CRI or Docker log files, grep output; envoy/wrappers.py), STATS (admin
    `/stats` text) or CLUSTERS (admin `/clusters`, text or JSON). Raises InputError (one line) when it cannot
    be read or is none of them."""
    head = _head(path)
    if head[:4] in _MAGICS:
        return CAPTURE
    text = head.decode(text_encoding(head), errors="replace")
    lines = text.splitlines()
    if len(head) == SNIFF_BYTES and lines:
        lines = lines[:-1]  # cut at SNIFF_BYTES: the last line may be a piece
    lines = [line for line in lines if line.strip()]
    if any(parse_line(line, log_format) is not None
           or parse_component_stages(u.text for u in reversed(unwrap_layers(line))) is not None for line in lines):
        return ENVOY_LOG
    if any(parse_line(line, log_format) is not None for line in _pretty_objects(lines)):
        return ENVOY_LOG
    first = lines[0].strip() if lines else ""
    if first.startswith("{") and '"cluster_statuses"' in text:
        return CLUSTERS
    if first.startswith("{") and '"stats"' in text and '"name"' in text:
        raise InputError(f"{path}: a /stats dump in JSON, which analyze does not read; save /stats as text "
                         f"(curl localhost:15000/stats, or kubectl exec POD -c istio-proxy -- pilot-agent "
                         f"request GET stats)")
    if _CLUSTERS_TEXT_LINE.match(first):
        return CLUSTERS
    if _stats_line(first) and sum(map(_stats_line, lines)) > len(lines) // 2 \
            and any(_ENVOY_STAT_ROOT.match(line) for line in lines):
        return STATS
    if looks_like_prometheus(lines):
        return STATS  # /stats/prometheus, a scrape of :15090
    if any(_PROXY_LOG_LINE.match(unwrap(line).text) for line in lines[:50]):
        return ENVOY_LOG
    raise InputError(f"{path}: not a capture (pcap, pcapng), an Envoy log or an admin dump (/stats, /clusters); "
                     f"an access log of the mesh's own format reads with --log-format")


def _pretty_objects(lines: list[str]) -> list[str]:
    """The JSON objects `jq` printed over several lines (``{`` alone to ``}``), each joined into one line: a
    JSON access log in a ticket often comes so (sources/envoy_files.py joins them the same way)."""
    out, held = [], []
    for line in lines:
        text = unwrap(line).text.strip()
        if text == "{" and not held:
            held = [text]
        elif held:
            held.append(text)
            if text.startswith("}") or len(held) > 300:
                out.append(" ".join(held).rstrip(","))
                held = []
    return out


def check_capture(path: str) -> None:
    """Raise InputError unless ``path`` is a readable pcap or pcapng file (gzipped or not)."""
    if _head(path)[:4] not in _MAGICS:
        raise InputError(f"{path}: not a pcap or pcapng capture (tcpdump -w / Wireshark format expected)")


def content_digest(path: str) -> str:
    """A digest of ``path``'s bytes: two files with the same one hold the same frames or lines."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


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


async def _split(path: str, into: str) -> tuple[list[str], str | None]:
    """editcap -c CHUNK_PACKETS: the chunk files in order, and editcap's complaint (a file cut short) if any."""
    with open(path, "rb") as fh:
        ext = ".pcapng" if fh.read(4) == b"\x0a\x0d\x0d\x0a" else ".pcap"
    # editcap writes the whole file before any chunk is read; the event loop (a TUI's screen) goes on meanwhile.
    proc = await asyncio.create_subprocess_exec("editcap", "-c", str(CHUNK_PACKETS), path,
                                                os.path.join(into, "chunk" + ext),
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                preexec_fn=functools.partial(die_with_parent, _libc()))
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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(libc: ctypes.CDLL) -> None:
    """In a child before exec: the kernel SIGKILLs it when we die, however we die (a SIGKILL leaves no time
    to end it ourselves, and an editcap left running goes on writing a copy of the user's capture). ``libc``
    is loaded in the parent (``_libc()``): a dlopen in the forked child could wait forever on a loader lock
    another thread held at the fork."""
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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


async def _run_prepass(path: str, into: str) -> PrepassResult | None:
    """prepass() in a thread (the event loop, a TUI's screen, goes on); cancelled, it is stopped and waited for
    before the caller removes ``into``, so no chunk is written after."""
    stop = threading.Event()
    per_chunk = min(PREPASS_CHUNK_PACKETS, CHUNK_PACKETS)  # a test's small CHUNK_PACKETS applies here too
    task = asyncio.ensure_future(asyncio.to_thread(prepass, path, into, per_chunk, stop))
    try:
        return await asyncio.shield(task)
    except BaseException:
        stop.set()
        await asyncio.wait({task})
        raise


async def read_capture(a: CaptureArg, slots: asyncio.Semaphore, shared: bool, on_event, gate) -> ReadResult:
    """Read capture ``a`` into ``on_event`` with one tshark slot of ``slots``: through the pre-pass when it pays
    (PREPASS_ABOVE_BYTES), else a large file in chunks of CHUNK_PACKETS (editcap); either way each chunk's
    frames renumbered back to the file's own. ``gate`` is the merge's turn-taking (sources/merge.py). Returns
    what tshark read, with ``frames_read`` the frames of the user's file."""
    # ``shared``: fewer tshark slots than files. A reader then reads a whole chunk once it holds a slot (the
    # merge buffers it) and waits its turn in capture time only between chunks: a reader holding the slot while
    # shut at the gate would wait for packets of another file that no tshark can read.
    async def read(path: str, offset: int = 0, frame_map=None) -> ReadResult:
        await gate()
        async with slots:
            return await read_file(path, a.path, a.iface, on_event, force_iface=a.explicit,
                                   gate=None if shared else gate, frame_offset=offset, frame_map=frame_map)

    # Beside the input when we may write there (the same disk, not a RAM-backed /tmp), else TMPDIR; with
    # neither, the file is read whole by one tshark (slower on a big file, the same findings).
    parent = os.path.dirname(os.path.abspath(a.path))
    if _prepass_wanted(a.path) and _scratch_usable(parent):
        with tempfile.TemporaryDirectory(prefix=private_dir_prefix("chunks"),  # mode 0700: the capture's bytes
                                         dir=parent if os.access(parent, os.W_OK) else None) as tmp:
            kept = await _run_prepass(a.path, tmp)
            if kept is not None:
                return await _read_kept(kept, read)
        # A file the pre-pass does not follow: read as without it.
    if os.path.getsize(a.path) <= (SHARED_CHUNK_ABOVE_BYTES if shared else CHUNK_ABOVE_BYTES) \
            or not shutil.which("editcap") or not _scratch_usable(parent):
        return await read(a.path)
    with tempfile.TemporaryDirectory(prefix=private_dir_prefix("chunks"),  # mode 0700: the chunks are the capture
                                     dir=parent if os.access(parent, os.W_OK) else None) as tmp:
        chunks, complaint = await _split(a.path, tmp)
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
