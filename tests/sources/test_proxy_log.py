"""The followed istio-proxy log, live (sources/proxy_log.py), fed real Envoy 1.40 lines (the lab's recordings in
tests/envoy/data/component_log/) the way the API hands them over: in pieces of any size, lines cut across them.
What it gives must be what `analyze` gives for the same lines read from a file (sources/envoy_files.py)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from kubectl_meshdoctor.core.events import AccessLogEvent, EnvoyLogEvent
from kubectl_meshdoctor.kube.logs import LogFollower
from kubectl_meshdoctor.sources import proxy_log
from kubectl_meshdoctor.sources.envoy_files import read_access_log
from kubectl_meshdoctor.sources.proxy_log import ProxyLogStream, log_source

LOGS = sorted((Path(__file__).parent.parent / "envoy" / "data" / "component_log").glob("*.log"))


def follow(data: bytes, seed: int, source: str = "pod/web istio-proxy") -> tuple[list, ProxyLogStream, LogFollower]:
    """``data`` through a LogFollower and a ProxyLogStream in random pieces of 1 byte to 8 KiB; the events the loop
    was handed, in order."""
    loop = asyncio.new_event_loop()
    events: list = []
    try:
        stream = ProxyLogStream(source, loop, events.append)
        follower = LogFollower(None, "ns", "web", "istio-proxy", stream.line, stream.burst, stream.ended)
        rng = random.Random(seed)
        at = 0
        while at < len(data):
            n = rng.choice((1, 7, 80, 333, 4096, 8192))
            follower.feed(data[at:at + n])
            at += n
        stream.ended()
        # One turn of the loop runs every batch the stream queued on it (call_soon_threadsafe): a drain, not a wait.
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    return events, stream, follower


def offline(path: Path) -> list:
    events: list = []

    async def gate() -> None:
        return None

    asyncio.run(read_access_log(str(path), events.append, gate))
    return events


def shape(ev) -> tuple:
    """What an event says, without where it was read from (the source names differ) and when (a live access-log
    line is stamped when it is read)."""
    if isinstance(ev, AccessLogEvent):
        return ("access", ev.line, ev.entry.raw)
    return ("envoy", ev.ts, ev.fact, ev.ref.line, ev.ref.kind, ev.ref.text, ev.ref.raw)


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_live_pieces_give_the_events_a_file_gives(path):
    want = [shape(e) for e in offline(path)]
    assert any(s[0] == "envoy" for s in want) and any(s[0] == "access" for s in want)
    for seed in range(3):
        events, stream, follower = follow(path.read_bytes(), seed)
        assert [shape(e) for e in events] == want
        assert {e.source if isinstance(e, AccessLogEvent) else e.ref.source for e in events} == {"pod/web istio-proxy"}
        counts = stream.counts
        assert counts.lines == follower.lines == len(path.read_text().splitlines())
        assert counts.access_log == sum(1 for s in want if s[0] == "access")
        assert counts.facts == sum(1 for s in want if s[0] == "envoy")
        assert counts.component >= counts.facts and counts.unreadable == 0 and follower.dropped == 0


def test_every_recording_at_once_numbers_lines_from_the_start_of_the_follow():
    data = b"".join(p.read_bytes() for p in LOGS)
    events, stream, _ = follow(data, 7)
    lines = data.decode().splitlines()
    for ev in events:
        number = ev.line if isinstance(ev, AccessLogEvent) else ev.ref.line
        raw = ev.entry.raw if isinstance(ev, AccessLogEvent) else ev.ref.raw
        assert lines[number - 1] == raw
    assert stream.counts.lines == len(lines)


def test_an_entry_left_open_when_the_log_goes_quiet_is_handed_on_by_idle():
    """Envoy's default format ends a header dump with an empty line (envoyproxy/envoy#14735 has such a paste), which
    may come in a later piece, or only with the next entry: once the log is quiet for QUIET_S the dump is complete."""
    now = [100.0]
    loop = asyncio.new_event_loop()
    events: list = []
    try:
        stream = ProxyLogStream(log_source("web"), loop, events.append, clock=lambda: now[0])
        follower = LogFollower(None, "ns", "web", "istio-proxy", stream.line, stream.burst, stream.ended)
        follower.feed(b"[2021-01-23 19:27:30.631][124][debug][http] [source/common/http/conn_manager_impl.cc:1612] "
                      b"[C23][S13529278531814971024] encoding headers via codec (end_stream=true):\n"
                      b"':status', '503'\n'server', 'envoy'\n")
        loop.run_until_complete(asyncio.sleep(0))  # a drain of what was queued, as in follow(): no wait
        assert events == []  # the dump may go on
        now[0] += proxy_log.QUIET_S / 2
        stream.idle()
        loop.run_until_complete(asyncio.sleep(0))
        assert events == []
        now[0] += proxy_log.QUIET_S
        stream.idle()
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    (ev,) = events
    assert isinstance(ev, EnvoyLogEvent) and ev.fact.connection == 23 and ev.ref.line == 1
    assert ("status" in ev.fact.detail or ev.fact.headers) and stream.counts.component == 1


def test_other_lines_are_counted_and_unreadable_access_lines_dropped_by_count():
    data = (b"2026-12-03T13:40:02.000000Z\tinfo\tStarting proxy agent\n"  # pilot-agent's own line
            b"[2026-12-03T13:40:02.254Z] \"GET / HTTP/1.1\" 200 oops\n"  # starts as an access-log line, is not one
            b"\n")
    events, stream, follower = follow(data, 1)
    assert events == []
    assert stream.counts.other == 1 and stream.counts.unreadable == 1 and stream.counts.lines == 3
    assert follower.dropped == 1 and follower.drop_reason == "ValueError"
