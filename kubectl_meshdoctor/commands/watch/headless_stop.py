"""How a headless watch ends when the user stops it and the API server will not let it wind down.

The clean end (tcpdump's last packets and counts, the sidecar's counters, the kernel's, the log levels put back)
takes a fraction of a second against a server that answers (0.3 s in the lab). Against one that accepts
connections and never answers, each of those calls would wait out the client's timeouts and retries: a signal
must end the run at once, whatever it waits on. So after END_GRACE_S the report is what was found so far, said
so, and the process leaves without the threads still waiting (the debug container's own timer ends tcpdump and
puts the log levels back: kube/debug.py, kube/envoy_guard.py).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
from collections.abc import Callable, Hashable

from kubectl_meshdoctor.core.findings import Problem
from kubectl_meshdoctor.core.pipeline import Pipeline, merged_stats
from kubectl_meshdoctor.core.report_model import LiveSource, Report

END_GRACE_S = 2.0  # seconds a stopped run may wind down with no step done (the lab's clean end: 0.3 s a pod)


async def within_grace(run: asyncio.Future, stop: asyncio.Event,
                       steps: Callable[[], Hashable] = lambda: None) -> bool:
    """Wait for ``run``; once ``stop`` is set, for as long as it winds down: it is given up when END_GRACE_S pass
    and ``steps()`` (where each pod's wind-down is, e.g. its phases) has not changed. Whether ``run`` is done.

    A fixed grace gave up on a hundred pods winding down against a server that answered (each pod a few calls:
    tcpdump's counts, /stats, the kernel's counters; 100 pods took several seconds), and printed no counts; a
    server that answers nothing still holds every pod at its first call, so the run ends END_GRACE_S after the
    stop, as before."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({run, stopping}, return_when=asyncio.FIRST_COMPLETED)
        while not run.done():
            before = steps()
            await asyncio.wait({run}, timeout=END_GRACE_S)
            if steps() == before:
                break
    finally:
        stopping.cancel()
    return run.done()


def found_so_far(pipelines: list[Pipeline], pods: list[str], namespace: str) -> Report:
    """The report of a run the API server held past its stop: every finding emitted so far, the packets counted,
    and a problem saying what was not read. It exits 2 unless a finding is an error: no clean end, no "nothing
    wrong"."""
    stats = merged_stats(pipelines)
    findings = sorted((f for p in pipelines for f in p.findings), key=lambda f: f.ts)
    what = (f"stopped, and the API server did not answer within {END_GRACE_S:g} s while the run wound down: "
            f"tcpdump's counts, the sidecar's and the kernel's counters were not read and the log levels not put "
            f"back (the debug container's timer ends tcpdump and puts them back); these are the findings so far")
    return Report(LiveSource(tuple(pods), namespace, ended="stopped"), stats, findings,
                  [Problem("watch", what)], captured_nothing=True)


def leave_now(code: int) -> None:
    """End the process with ``code`` now: the exit handlers run (the kubeconfig's key copies, our private
    directories), the output is flushed, and no thread still waiting on the API server is waited for."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

