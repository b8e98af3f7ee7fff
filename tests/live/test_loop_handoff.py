"""The thread-to-loop hand-off both live readers use (kubectl_meshdoctor/loop_handoff.py): order, back-pressure,
and a reader never left waiting on a loop that is gone or a run that is over."""

from __future__ import annotations

import asyncio
import threading

from kubectl_meshdoctor.loop_handoff import LoopHandoff

from ..waiting import wait_until, wait_until_async


def test_batches_from_a_thread_arrive_in_order_and_the_thread_waits_for_a_slow_loop():
    got: list[int] = []
    most_pending = 0

    async def main() -> None:
        loop = asyncio.get_running_loop()
        handoff: LoopHandoff[int] = LoopHandoff(loop, got.append, max_pending=5, wait_s=0.05)

        def reader() -> None:
            for start in range(0, 200, 4):
                handoff.hand_on(list(range(start, start + 4)))

        def all_fed() -> bool:
            nonlocal most_pending
            most_pending = max(most_pending, handoff._pending)  # looked at between the loop's turns
            return not thread.is_alive() and len(got) >= 200

        thread = threading.Thread(target=reader)
        thread.start()
        # Looks 1 ms apart: a loop busy elsewhere between its turns, so batches pile up to the bound.
        await wait_until_async("200 numbers fed and the reader done", 30, all_fed, poll_s=0.001)
        thread.join()

    asyncio.run(main())
    assert got == list(range(200))
    # past max_pending the reader waits: never more than one batch beyond the bound is queued
    assert 0 < most_pending <= 5 + 4


def test_close_releases_a_waiting_reader_and_later_batches_are_dropped():
    got: list[int] = []

    async def main() -> threading.Thread:
        loop = asyncio.get_running_loop()
        handoff: LoopHandoff[int] = LoopHandoff(loop, got.append, max_pending=0, wait_s=30.0)
        handoff.hand_on([1])  # from the loop's thread: queued, not yet fed
        thread = threading.Thread(target=handoff.hand_on, args=([2],))
        thread.start()  # one pending > max_pending 0: it waits (up to wait_s between looks)
        thread.join(0.3)
        assert thread.is_alive()
        handoff.close()
        wait_until("the waiting reader let go", 5.0, lambda: not thread.is_alive(), poll_s=0.01)
        handoff.hand_on([3])
        # One turn of the loop, not a wait for something to come: it feeds [1], queued before, and would feed [3]
        # had it been queued (call_soon callbacks run on the next turn); that [3] never comes is the test.
        await asyncio.sleep(0)
        return thread

    asyncio.run(main())
    assert got == [1]


def test_a_reader_after_the_loop_closed_neither_raises_nor_waits():
    got: list[int] = []
    loop = asyncio.new_event_loop()
    handoff: LoopHandoff[int] = LoopHandoff(loop, got.append, max_pending=10, wait_s=30.0)
    loop.close()
    handoff.hand_on([1, 2])
    assert handoff.closed and got == []
    handoff.hand_on([3])  # closed: dropped at once
    assert got == []
