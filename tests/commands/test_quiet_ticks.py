"""A live pipeline that gets Envoy's log and no packet still ticks (commands/watch/ticking.py): a failing request
the debug log tells of is reported while the run goes on, not only when it ends. Real Envoy 1.40 lines (the lab's
refused recording), the real pipeline and detectors; only the wall clock is the test's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubectl_meshdoctor.commands.watch import ticking
from kubectl_meshdoctor.commands.watch.ticking import QuietTicker
from kubectl_meshdoctor.core.events import EnvoyLogEvent, PacketEvent, TcpFlags
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources.envoy_files import read_access_log

REFUSED = Path(__file__).parent.parent / "envoy" / "data" / "component_log" / "refused.log"


def refused_events() -> list:
    events: list = []

    async def gate() -> None:
        return None

    asyncio.run(read_access_log(str(REFUSED), events.append, gate))
    return events


def test_envoy_log_alone_is_reported_while_the_run_goes_on():
    found = []
    pipeline = Pipeline.with_detectors(on_finding=found.append, pod="refused")
    wall = [1_000.0]
    ticker = QuietTicker(pipeline, wall=lambda: wall[0])
    noted = ticker.wrap(pipeline.context)
    events = refused_events()
    assert any(isinstance(e, EnvoyLogEvent) for e in events)
    for ev in events:
        noted(ev)
    assert found == [] and not ticker.look()  # nothing told yet: the requests are younger than the grace
    for _ in range(40):  # 20 s of quiet, looked at every EVERY_S
        wall[0] += ticking.EVERY_S
        ticker.look()
    assert ticker.ticks > 0
    assert found, "no finding before the end of the run"
    f = found[0]
    assert "UF" in f.envoy_flags and f.envoy_log and "envoy-log" in f.stands_on
    assert any("delayed connect error" in line for line in f.envoy_log)
    # Ticks follow the pod's clock (Envoy's timestamps), a QUIET_S behind it, never ahead.
    last = max(e.ts for e in events if isinstance(e, EnvoyLogEvent))
    assert ticker._last_tick <= last + (wall[0] - 1_000.0)


def test_no_tick_while_packets_come():
    pipeline = Pipeline.with_detectors()
    wall = [2_000.0]
    ticker = QuietTicker(pipeline, wall=lambda: wall[0])
    for i in range(10):
        pipeline.feed(PacketEvent(2_000.0 + i * 0.5, "lo", "t/lo", i + 1, "127.0.0.6", 40000 + i, "127.0.0.1", 5000,
                                  TcpFlags.SYN, 1, 0))
        wall[0] += 0.5
        assert not ticker.look()
    assert ticker.ticks == 0  # the packets tick the pipeline themselves
    wall[0] += ticking.QUIET_S + ticking.EVERY_S
    assert ticker.look() and ticker.ticks == 1
    assert 2_004.5 < ticker._last_tick <= wall[0] - ticking.QUIET_S  # past the newest packet, behind the clock
