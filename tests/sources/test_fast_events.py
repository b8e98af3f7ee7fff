"""sources/fast_events.epoch: the float tshark's frame.time_epoch text reads as, computed without the text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.sources.fast_events import epoch

SECS = st.integers(min_value=0, max_value=2**32 - 1)  # a pcap record's seconds field
EDGES = (0, 1, 5, 999_999_999, 500_000_000, 123_456_789, 100_000_001)


@settings(max_examples=500, deadline=None)
@given(SECS, st.integers(min_value=0, max_value=999_999_999))
def test_nanoseconds_read_as_the_text_does(secs, nsecs):
    assert epoch(secs, nsecs) == float(f"{secs}.{nsecs:09d}")


@settings(max_examples=500, deadline=None)
@given(SECS, st.integers(min_value=0, max_value=999_999))
def test_microseconds_read_as_the_text_does(secs, usecs):
    assert epoch(secs, usecs * 1000) == float(f"{secs}.{usecs:06d}")


def test_the_edges_of_a_second():
    for secs in (0, 1, 1_733_333_333, 2**31 - 1, 2**32 - 1):
        for nsecs in EDGES:
            assert epoch(secs, nsecs) == float(f"{secs}.{nsecs:09d}")
