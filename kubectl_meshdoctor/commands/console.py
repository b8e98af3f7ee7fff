"""What every command prints on the terminal besides its report: the one-line error, and a progress line.

Errors are one line on stderr and exit 2 (docs/DESIGN.md, exit codes); progress goes to a terminal only, so a
script's stderr holds just the error line.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

from kubectl_meshdoctor.exit_codes import EXIT_USAGE
from kubectl_meshdoctor.frontends.shown import block

PROG = "kubectl meshdoctor"


def error(message: str) -> int:
    """Write ``PROG: error: message`` to stderr; return the usage exit code (2)."""
    # A path or a server's message may hold ESC; a message's own lines (the Role a refusal prints) stay lines.
    sys.stderr.write(f"{PROG}: error: {block(message)}\n")
    return EXIT_USAGE


async def progress_line(pipelines, label: str, every_s: float = 1.0,
                        waiting: Callable[[], str | None] | None = None) -> None:
    """Rewrite one status line on a terminal's stderr every ``every_s`` seconds until cancelled; ``pipelines``
    is one Pipeline or a list that may grow (one per pod). ``waiting`` says what the run waits on before its
    capture starts (None once it runs): that, not "0 packets analysed", is then the line."""
    if not sys.stderr.isatty():
        return
    try:
        while True:
            await asyncio.sleep(every_s)
            what = waiting() if waiting is not None else None
            if what:
                sys.stderr.write(f"\r\033[K{what} ")
                sys.stderr.flush()
                continue
            group = pipelines if isinstance(pipelines, list) else [pipelines]
            packets = sum(p.stats.packets for p in group)
            findings = sum(len(p.findings) for p in group)
            per_iface = ", ".join(f"{k} {v.packets}" for k, v in sorted(group[0].stats.by_iface.items())) \
                if len(group) == 1 else f"{len(group)} pods"
            # "so far": packets still on their way (tcpdump's and tshark's buffers, a file's rest) are counted in
            # the report's headline, which is the total; findings are instances, the verdict counts problems.
            sys.stderr.write(f"\r{label}, so far: {packets} packets analysed ({per_iface}), {findings} findings ")
            sys.stderr.flush()
    finally:
        end_progress_line()


def end_progress_line() -> None:
    """Erase the progress line on a terminal's stderr, at once. Called before a report or a problem line is
    written: a cancelled progress_line erases it only when the loop next runs its task, which may be after the
    report went out, glued to the line's end (stdout and stderr on one terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
