"""A stopped headless watch waits for its wind-down while the wind-down moves, and no longer once it stalls."""

from __future__ import annotations

import asyncio
import time

from kubectl_meshdoctor.commands.watch import headless_stop
from kubectl_meshdoctor.commands.watch.headless_stop import within_grace

GRACE_S = 0.5  # a step every fifth of it: a loaded CI machine may wake a sleeper 100 ms late
STEP_S = GRACE_S / 5


async def _stopped_run(steps_s: list[float], phases: list[str]) -> bool:
    """A run that, once stopped, takes each of ``steps_s`` in turn (a pod's wind-down step each), saying each
    in ``phases``; whether within_grace saw it end."""
    stop = asyncio.Event()

    async def run() -> None:
        await stop.wait()
        for i, s in enumerate(steps_s):
            # The step's length is the input: within_grace is judged on time passing between steps, nothing to await.
            await asyncio.sleep(s)
            phases.append(f"step {i}")

    task = asyncio.ensure_future(run())
    stop.set()
    try:
        return await within_grace(task, stop, lambda: len(phases))
    finally:
        task.cancel()


def test_a_long_wind_down_that_moves_is_waited_for(monkeypatch):
    monkeypatch.setattr(headless_stop, "END_GRACE_S", GRACE_S)
    phases: list[str] = []
    steps = [STEP_S] * 12  # 2.4 graces in all, never one without a step
    assert asyncio.run(_stopped_run(steps, phases))
    assert len(phases) == len(steps)


def test_a_stalled_wind_down_is_given_up_after_the_grace(monkeypatch):
    monkeypatch.setattr(headless_stop, "END_GRACE_S", GRACE_S)
    phases: list[str] = []
    t0 = time.monotonic()
    assert not asyncio.run(_stopped_run([STEP_S, STEP_S, 30.0], phases))
    took = time.monotonic() - t0
    assert phases == ["step 0", "step 1"]
    assert took < GRACE_S * 4, took  # the stall's grace after the last step, not the 30 s step


def test_without_steps_the_grace_is_fixed(monkeypatch):
    monkeypatch.setattr(headless_stop, "END_GRACE_S", GRACE_S)
    t0 = time.monotonic()
    assert not asyncio.run(_stopped_run([30.0], []))
    assert time.monotonic() - t0 < GRACE_S * 3
