"""A two-pod run of the mesh recordings (tests/data/envoy-1.40-mesh*/SCENARIO/{caller,server}) as a watch of both
pods would see it: each pod's packets (real tshark on the recorded captures) and its followed istio-proxy log's
events, in capture-time order, into that pod's pipeline, ticked by commands/watch/ticking.py's QuietTicker as the
wall clock goes on after the last event. Nothing is finished: what a front end can show during the run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from kubectl_meshdoctor.commands.watch.ticking import EVERY_S, QuietTicker
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources.envoy_files import read_access_log
from kubectl_meshdoctor.sources.tshark import read_file

DATA = Path(__file__).parent / "data"


async def _gate() -> None:
    return None


async def pod_events(directory: Path, pod: str) -> list:
    """Every event of one pod's recording, in time order (a packet before a log line of the same time). The
    evidence sources are named as a live watch names them (``pod/iface``, ``pod/NAME istio-proxy``)."""
    events: list = []
    for iface in ("lo", "eth0"):
        await read_file(str(directory / f"{iface}.pcap"), f"{pod}/{iface}", iface, events.append)
    await read_access_log(str(directory / "istio-proxy.log"), events.append, _gate)
    return sorted(events, key=lambda ev: (ev.ts, not isinstance(ev, PacketEvent)))


async def replay(scenario: str, pipelines: Callable[[str], Pipeline], recording: str = "envoy-1.40-mesh",
                 pods: tuple[str, str] = ("caller", "server"), quiet_s: float = 12.0,
                 step: Callable[[], object] | None = None) -> list[QuietTicker]:
    """Feed ``scenario``'s two pods (named ``pods``) to ``pipelines(pod)``, both in one time order, then let
    ``quiet_s`` seconds of wall clock pass with nothing arriving (each ticker looked at every EVERY_S). ``step``
    (awaited if it returns an awaitable) runs after every event and every look: a screen gets to draw."""
    streams = []
    for side, name in zip(("caller", "server"), pods):
        pipeline = pipelines(name)
        streams.append((pipeline, await pod_events(DATA / recording / scenario / side, name)))
    merged = sorted(((ev, p) for p, evs in streams for ev in evs),
                    key=lambda x: (x[0].ts, not isinstance(x[0], PacketEvent)))
    last = merged[-1][0].ts
    wall = [merged[0][0].ts]
    tickers = {id(p): QuietTicker(p, wall=lambda: wall[0]) for p, _ in streams}
    for ev, p in merged:
        wall[0] = ev.ts
        if isinstance(ev, PacketEvent):
            p.feed(ev)
        else:
            tickers[id(p)].wrap(p.context)(ev)
        await _step(step)
    while wall[0] < last + quiet_s:
        wall[0] += EVERY_S
        for t in tickers.values():
            t.look()
        await _step(step)
    return list(tickers.values())


async def _step(step) -> None:
    if step is None:
        return
    done = step()
    if asyncio.iscoroutine(done):
        await done
