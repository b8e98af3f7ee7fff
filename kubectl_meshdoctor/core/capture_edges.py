"""Whether a request Envoy logged lies within what a pod's captures could show of it, and the report's line on the
failing lines that do not (core/correlate.py reads them as context, not judged).

A capture shows a request's cause only over the span it ran: a request that began before it (the pod's log is
followed before tcpdump starts), or was still open when it stopped (a watch's ``--duration`` ending between the
app's ``GET`` on lo and its RST 200 ms later), has a part where its cause would show that no packet read could
show. Such a line is context, as one from before a live capture began; a line wholly inside the span whose cause
the packets do not show is judged (the cause is elsewhere: "not in this evidence"), and one wholly outside is
commands/outside_span.py's in analyze.
"""

from __future__ import annotations

from collections.abc import Mapping

from .unseen import IfaceStats, span

LOG_RESOLUTION_S = 0.001  # Envoy's %START_TIME% and %DURATION% are whole milliseconds (truncated)
# The response flags whose cause only packets show (a reset, a refused connect, a malformed message, the caller
# going away): a line of these alone across an edge is context. A line of any other flag (UO, UH, NR, UT, a rate
# limit...) is proven by the log itself and its detector's claim, wherever the capture stopped: never set aside.
PACKET_CAUSED = frozenset({"UC", "UF", "URX", "UPE", "DC", "DPE"})


def packet_caused(flags: tuple[str, ...]) -> bool:
    """Whether every one of a line's response ``flags`` (one at least) is of a cause only packets show."""
    return bool(flags) and PACKET_CAUSED.issuperset(flags)


def edge(by_iface: Mapping[str, IfaceStats], start: float, duration_ms: int,
         stopped: float | None = None) -> str | None:
    """Whether a request logged at ``start`` (seconds since the epoch) lasting ``duration_ms`` runs across an edge
    of the span of the pod's packets read (``by_iface``, core/unseen.span): "before" (it began before the first
    packet and ended after it), "after" (it began by the latest and ended after it, or, in a live run, began after
    its capture ``stopped``: the time it knew the capture over, no earlier than tcpdump's end), else None (wholly
    inside, wholly outside, nothing read, no start). Its times are whole milliseconds: the start is taken as late as
    it may be, the end (start plus duration) is no later than the real one, so an edge said is one for sure."""
    if stopped is not None and start > stopped:
        return "after"
    read = span(by_iface)
    if read is None or not start:
        return None
    first, last = read
    end = start + duration_ms / 1000.0
    if start + LOG_RESOLUTION_S <= first <= end:
        return "before"
    return "after" if start <= last < end else None


def context_note(before: int, after: int, live: bool) -> str | None:
    """One line on the failing access-log lines read as context: ``before`` of requests begun before the capture
    (a live run's start, or the first packet), ``after`` of requests still open at its last packet; a live run
    (``live``) speaks of its capture, analyze of the captures given. None when there were none."""
    capture = "the capture" if live else "the captures given"
    said = [f"{before} failing access-log line(s) of requests that began before {capture} did were read as "
            f"context, not judged: no packet of their start could be seen" if before else "",
            f"{after} failing access-log line(s) of requests "
            + ("that ended after the capture stopped (open at its last packet, or begun after it)" if live else
               "still open at the end of the captures given (they ended after their last packet)")
            + " were read as context, not judged: their end, where a cause shows, was not captured" if after else ""]
    return "; ".join(w for w in said if w) or None
