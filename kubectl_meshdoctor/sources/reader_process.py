"""sources/interleave.py's read of several capture files, run in a process of its own.

One Python process runs one thread at a time: analyze reading a capture pair spent its CPU time as wall time,
the pre-pass, the fast path and the detectors taking turns on one core while the other waited. Here the read
(each file's pre-pass, the merge by capture time, the fast path's events, any tshark it starts) runs in a child
Python process, and the analyze process only turns what it is handed into events for its detectors: the two
halves run at once, on two cores.

The events cross the child's stdout in capture-time order, in batches packed by columns (sources/event_columns.py)
and rebuilt here into the same PacketEvents. The last message is the ReadResult of each file, or the exception
the read raised, raised again here. The child is started by ``sys.executable -m`` this module, is told its job on
its stdin, ignores the terminal's Ctrl-C (the analyze process stops it) and is ended by its PID when the read is
cancelled; a child that cannot start leaves the read to this process, as before.

Small inputs are read in this process: a child's start (~0.2 s, ~30 MB) costs more than it saves below
``APART_BYTES`` of capture.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
from collections.abc import Callable, Sequence

from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.gc_tuning import tune_gc

from .event_columns import Packer, Unpacker, row_of
from .interleave import read_interleaved
from .merge import SeenOnce
from .pipes import grow_pipe
from .tshark import ReadResult

# Capture bytes (all files together) from which the read runs in a child: ~0.2 s of CPU to start it, and the
# read of 8 MiB of short connections (~35k packets) takes ~0.7 s, of which the child takes about half.
APART_BYTES = 8 << 20
BATCH = 4096  # events a message: fewer writes and reads, ~200 KB at most but for HTTP/1 start lines
FIRST_BATCH = 256  # the first message's: the detectors' process waits for it, idle
# What the child's stdout holds before a write waits: several messages. The two processes run at once on two
# cores, each nearly all the time; with Linux's 64 KiB (a third of a message) the child waited at every batch
# the detectors' process took to read, and that one then waited for the rest of the next message: each used
# ~0.89 of a core, ~0.92 with this (bench/gen's short mix, analyze's wall 0.94x; bench/RESULTS.md).
PIPE_BYTES = 1 << 20
EVENTS, RESULTS, ERROR = b"E", b"R", b"X"
_HEAD = 5  # a message: its kind (1 byte), its length (4 bytes, little-endian), then the body
_STDERR_KEPT = 4096  # bytes of the child's stderr kept for the error that names why it ended


def apart_wanted(paths: Sequence[str]) -> bool:
    """Whether to read ``paths`` in a child process: MESHDOCTOR_READER_PROCESS=1 always, =0 never (tests and
    bench/ compare the two), else when the files hold APART_BYTES or more."""
    env = os.environ.get("MESHDOCTOR_READER_PROCESS")
    if env in ("0", "1"):
        return env == "1"
    try:
        return sum(os.path.getsize(p) for p in paths) >= APART_BYTES
    except OSError:
        return False


async def read_pair(paths: Sequence[str], sources: Sequence[str], ifaces: Sequence[str], forced: Sequence[bool],
                    header: bytes, on_event: Callable[[PacketEvent], None], seen_once: SeenOnce | None = None,
                    ) -> list[ReadResult]:
    """sources/interleave.py's read_interleaved (the same arguments, events, results and errors): in a child
    process when apart_wanted says so and one starts, else in this process. With ``seen_once``, a packet it
    drops is not handed on, and its ``dropped`` counts them (in the child, its own SeenOnce: ~0.6 us a packet
    taken from the detectors' process)."""
    if apart_wanted(paths) and (results := await read_apart(paths, sources, ifaces, forced, header, on_event,
                                                             seen_once)) is not None:
        return results
    push = on_event if seen_once is None else lambda ev: seen_once(ev) or on_event(ev)
    return await read_interleaved(paths, sources, ifaces, forced, header, push)


async def read_apart(paths: Sequence[str], sources: Sequence[str], ifaces: Sequence[str], forced: Sequence[bool],
                     header: bytes, on_event: Callable[[PacketEvent], None], seen_once: SeenOnce | None = None,
                     ) -> list[ReadResult] | None:
    """``read_interleaved(paths, sources, ifaces, forced, header, on_event)`` in a child process: the same events
    in the same order, the same ReadResults, the same exceptions (OSError when a file cannot be read). None when
    no child could be started (nothing was read: the caller reads in this process). RuntimeError when the child
    ended without an answer (killed: its signal is named). With ``seen_once``, the child drops what a SeenOnce
    of its own drops, and ``seen_once.dropped`` gets its counts."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH")))))
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, limit=1 << 20)
    except OSError:
        return None
    stderr = bytearray()

    async def keep_stderr() -> None:  # drained, so that a chatty child never blocks on a full pipe
        while chunk := await child.stderr.read(1 << 16):
            stderr[:] = (stderr + chunk)[-_STDERR_KEPT:]

    drain = asyncio.ensure_future(keep_stderr())
    answered = False
    inbox = Unpacker(on_event)
    try:
        child.stdin.write(pickle.dumps((list(paths), list(sources), list(ifaces), list(forced), header,
                                        seen_once is not None)))
        await child.stdin.drain()
        child.stdin.close()
        while True:
            try:
                head = await child.stdout.readexactly(_HEAD)
                body = await child.stdout.readexactly(int.from_bytes(head[1:], "little"))
            except asyncio.IncompleteReadError:
                break
            kind = head[:1]
            if kind == EVENTS:
                inbox.take(body)
            elif kind == RESULTS:
                answered = True
                results, dropped = pickle.loads(body)
                for pair, n in dropped.items():
                    seen_once.dropped[pair] = seen_once.dropped.get(pair, 0) + n
                return results
            elif kind == ERROR:
                answered = True
                raise pickle.loads(body)
        code = await child.wait()
        await drain
        said = bytes(stderr).decode("utf-8", "replace").strip().splitlines()
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        raise RuntimeError(f"the capture reader process ended without an answer ({why})"
                           + (f": {said[-1]}" if said else ""))
    finally:
        if child.returncode is None and not answered:
            child.terminate()  # our own child, by its PID: it ends its tshark and threads, then itself
        try:
            await asyncio.wait_for(asyncio.shield(child.wait()), 10)
        except asyncio.TimeoutError:
            child.kill()
            await child.wait()
        drain.cancel()


def _send(kind: bytes, body: bytes) -> None:
    data = kind + len(body).to_bytes(4, "little") + body
    while data:
        data = data[os.write(1, data):]


async def _child(job: tuple) -> None:
    paths, sources, ifaces, forced, header, dedup = job
    packer = Packer()
    seen_once = SeenOnce() if dedup else None

    limit = FIRST_BATCH

    def flush() -> None:
        nonlocal limit
        limit = BATCH
        if len(packer):
            _send(EVENTS, packer.message())

    def add(*row) -> None:  # the fast path's event
        if seen_once is None or not seen_once.row(row):
            packer.add_row(row)

    def on_event(ev: PacketEvent | None) -> None:  # None: the fast path's event, added by add
        if ev is not None:
            add(*row_of(ev))
        if len(packer) >= limit:
            flush()

    task = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        results = await read_interleaved(paths, sources, ifaces, forced, header, on_event, make_event=add,
                                         flags=range(64), http_start=bytes)
    except asyncio.CancelledError:
        return
    except BaseException as e:  # the parent raises it again
        flush()
        try:
            body = pickle.dumps(e)
        except Exception:
            body = pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
        _send(ERROR, body)
        return
    flush()
    _send(RESULTS, pickle.dumps((results, seen_once.dropped if seen_once else {})))


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the analyze process's to handle
    tune_gc()  # as the analyze process does (cli.py): its default cost this process ~4% of its CPU
    job = pickle.loads(sys.stdin.buffer.read())
    grow_pipe(1, PIPE_BYTES)
    try:
        asyncio.run(_child(job))
    except BrokenPipeError:  # the analyze process went away: nobody to answer
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
