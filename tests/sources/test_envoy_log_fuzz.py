"""Envoy's logs as they reach us from tickets and tools: real lines of every class (Envoy 1.40, the lab), cut,
shuffled, repeated, mixed with random text and bytes, through the file reader, the debug-log stories and every
detector: the run ends, with findings or problems, and never raises (issue 28's property test)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources.envoy_files import read_access_log

DATA = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40"
REAL = [ln for p in sorted(DATA.glob("*/istio-proxy.log")) for ln in p.read_text().splitlines()]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


async def _gate() -> None:
    return None


def run(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "proxy.log"
        path.write_text("\n".join(lines) + "\n", errors="surrogateescape")
        pipeline = Pipeline.with_detectors()

        def push(ev) -> None:
            pipeline.context(ev)
            pipeline.tick(ev.ts)

        read = asyncio.run(read_access_log(str(path), push, _gate))
        findings = pipeline.finish()
    assert read.lines >= 1
    assert all(f.detector and f.evidence for f in findings)


@st.composite
def cut(draw, line: str) -> str:
    """A real line, cut somewhere, or with a piece of it repeated."""
    if not line:
        return line
    i = draw(st.integers(0, len(line)))
    return draw(st.sampled_from([line[:i], line[i:], line[:i] + line[i:] * 2, line]))


@FUZZ
@given(st.lists(st.sampled_from(REAL).flatmap(cut) | st.text(max_size=200), min_size=1, max_size=300))
def test_real_lines_cut_shuffled_and_mixed_never_raise(lines):
    run(lines)


@FUZZ
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=50))
def test_bytes_never_raise(chunks):
    run([c.decode("utf-8", "replace") for c in chunks])


def test_every_recorded_line_read_in_reverse_order_never_raises():
    run(list(reversed(REAL)))
