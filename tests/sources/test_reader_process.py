"""The read of a capture pair in a child process (sources/reader_process.py) and the columns its events cross in
(sources/event_columns.py): the same events in the same order and the same read counts as the read in this
process, for every pair of lab captures in tests/data, with the fast path and without it (tshark's events); the
read's errors raised here; a cancelled read ends its child."""

from __future__ import annotations

import asyncio
import shutil

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.core.events import HttpStart, PacketEvent, TcpFlags, TlsStart
from kubectl_meshdoctor.sources import interleave, reader_process
from kubectl_meshdoctor.sources.event_columns import Packer, Unpacker
from kubectl_meshdoctor.sources.http1 import parse_http_start
from tests.sources.test_fastpath_interleave import DATA, PAIRS

needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")


def _read(paths: list[str], apart: bool) -> tuple[list, list]:
    header = interleave.interleavable(paths)
    assert header is not None
    events: list = []
    job = (paths, paths, ["lo", "eth0"], [False, False], header, events.append)
    results = asyncio.run(reader_process.read_apart(*job) if apart else interleave.read_interleaved(*job))
    return events, results


@needs_tshark
@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("pair", PAIRS)
def test_every_pair_gives_the_same_events_read_apart(monkeypatch, pair, fast):
    monkeypatch.setenv("MESHDOCTOR_FASTPATH", fast)  # the child's environment is this process's
    paths = [str(DATA / p) for p in pair]
    here, results_here = _read(paths, apart=False)
    apart, results_apart = _read(paths, apart=True)
    assert apart == here and here
    assert results_apart == results_here


@needs_tshark
def test_a_file_that_cannot_be_read_raises_here(tmp_path):
    lo, eth0 = (str(DATA / p) for p in PAIRS[0])
    gone = tmp_path / "gone-eth0.pcap"
    shutil.copy(eth0, gone)
    header = interleave.interleavable([lo, str(gone)])
    gone.unlink()  # after interleavable read it: the child's open fails
    with pytest.raises(OSError):
        asyncio.run(reader_process.read_apart([lo, str(gone)], [lo, str(gone)], ["lo", "eth0"], [False, False],
                                              header, lambda ev: None))


@needs_tshark
def test_a_cancelled_read_ends_its_child():
    lo, eth0 = (str(DATA / p) for p in PAIRS[0])
    me = psutil.Process()
    started: list[int] = []

    def cmdline(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # another test's child, gone meanwhile
            return ""

    def on_event(ev) -> None:  # the first event: the child is running; note it, then cancel the read
        if not started:
            started.extend(c.pid for c in me.children() if "reader_process" in cmdline(c))
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(reader_process.read_apart([lo, eth0], [lo, eth0], ["lo", "eth0"], [False, False],
                                              interleave.interleavable([lo, eth0]), on_event))
    assert started, "no child was seen running"
    assert not [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_apart_wanted_by_size_and_by_environment(tmp_path, monkeypatch):
    small = tmp_path / "a.pcap"
    small.write_bytes(b"\0" * 100)
    monkeypatch.delenv("MESHDOCTOR_READER_PROCESS", raising=False)
    assert not reader_process.apart_wanted([str(small)])
    with open(tmp_path / "b.pcap", "wb") as fh:
        fh.truncate(reader_process.APART_BYTES)
    assert reader_process.apart_wanted([str(small), str(tmp_path / "b.pcap")])
    monkeypatch.setenv("MESHDOCTOR_READER_PROCESS", "0")
    assert not reader_process.apart_wanted([str(tmp_path / "b.pcap")])
    monkeypatch.setenv("MESHDOCTOR_READER_PROCESS", "1")
    assert reader_process.apart_wanted([str(small)])


_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_pairs = st.lists(st.tuples(st.sampled_from(["Host", "x-request-id", "Cookie", "server", "X-Long"]), _texts),
                  max_size=6)
_http = st.one_of(
    st.none(),
    st.builds(HttpStart, st.sampled_from(["GET / HTTP/1.1", "HTTP/1.1 503 Service Unavailable", ""]),
              _pairs.map(tuple), st.lists(_texts, max_size=2).map(tuple), st.booleans(),
              st.lists(_texts, max_size=2).map(tuple)),
    st.sampled_from([b"GET /a HTTP/1.1\r\nHost: x\r\nx-request-id: 1\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n",
                     b"GET / HTTP/1.1\r\nbad line\r\n", b"HTTP/1.0 5"]))
_tls = st.one_of(st.none(), st.builds(TlsStart, st.sampled_from([21, 22, 23]), st.just(0x0303),
                                      st.integers(0, 1 << 14), st.none() | st.just(1), st.none() | _texts,
                                      st.lists(_texts, max_size=2).map(tuple)))
_rows = st.lists(st.tuples(
    st.floats(0, 2e9, allow_nan=False), st.sampled_from(["lo", "eth0", "eth1"]), st.sampled_from(["a", "b"]),
    st.integers(1, 2**32 - 1), st.sampled_from(["198.18.0.1", "::1", "127.0.0.6"]), st.integers(0, 65535),
    st.sampled_from(["198.18.0.2", "10.0.0.1"]), st.integers(0, 65535), st.integers(0, 63),
    st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 65535), _http, _tls), max_size=40)


@settings(max_examples=150, deadline=None)
@given(st.lists(_rows, max_size=6), st.booleans())
def test_columns_give_back_every_event(batches, small_tables):
    packer, got = Packer(3, 2) if small_tables else Packer(), []  # small: both sides' tables start again often
    unpacker = Unpacker(got.append)
    want = []
    for rows in batches:
        for row in rows:
            if row[12] is None or isinstance(row[12], bytes):
                packer.add_row(row)
            else:
                packer.put(PacketEvent(*row[:8], TcpFlags(row[8]), *row[9:]))
            http = parse_http_start(row[12]) if isinstance(row[12], bytes) else row[12]
            want.append(PacketEvent(*row[:8], TcpFlags(row[8]), *row[9:12], http, row[13]))
        assert unpacker.take(packer.message()) == len(rows)
    assert got == want
