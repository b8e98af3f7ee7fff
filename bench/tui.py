"""How responsive the TUI stays while packets pour in (issue 6, liveness): ``bench/tui [--packets N]``.

Replays a generated capture (bench/gen.py, cached like bench/run) into the real app (``analyze --tui``'s
session, headless through Textual's pilot) as fast as tshark reads it, which is faster than any live pod, and
meanwhile asks the app's event loop for a tick every 50 ms. It prints the packets/s replayed, how late the
ticks came (median, p99, max: a tick late by more than a frame means parsing blocked the screen), and the
longest gap between two refreshes of the header and findings (every 0.5 s when nothing blocks). Exit 1 when p99
lateness exceeds --max-late-ms (default 100) or a refresh gap exceeds 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench_run  # noqa: E402  (bench/run.py: the capture cache)

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.sources.files import CaptureArg

TICK_S = 0.05


async def measure(d: Path) -> dict:
    app = MeshDoctorApp(FileSession([CaptureArg.parse(str(d / "eth0.pcap")), CaptureArg.parse(str(d / "lo.pcap"))]))
    late: list[float] = []
    refreshes: list[float] = []
    refresh = app._refresh

    def timed_refresh() -> None:  # the header and findings refresh, timed where it runs
        refreshes.append(time.monotonic())
        refresh()

    app._refresh = timed_refresh
    async with app.run_test(size=(150, 45)) as pilot:
        started = time.monotonic()
        last_status = ""
        while "q quits" not in last_status:
            asked = time.monotonic()
            await asyncio.sleep(TICK_S)
            late.append(max(time.monotonic() - asked - TICK_S, 0.0))
            last_status = str(app.query_one("#status").render())
            if time.monotonic() - started > 600:
                raise SystemExit("bench/tui: the replay did not end within 600 s")
        wall = time.monotonic() - started
        packets = sum(app.session.stats().frames_read.values()) or app.session.stats().packets
        await pilot.press("q")
    gaps = [b - a for a, b in zip(refreshes, refreshes[1:])]
    late.sort()
    return {"wall_s": round(wall, 2), "frames_read": packets, "packets_per_s": round(packets / wall),
            "late_ms_median": round(statistics.median(late) * 1000, 1),
            "late_ms_p99": round(late[int(len(late) * 0.99) - 1] * 1000, 1), "late_ms_max": round(late[-1] * 1000, 1),
            "refresh_gap_max_s": round(max(gaps), 2) if gaps else None, "ticks": len(late)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/tui", description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-late-ms", type=float, default=100.0)
    a = ap.parse_args(argv)
    d = bench_run.capture_dir(HERE / ".cache", a.packets, a.seed)
    r = asyncio.run(measure(d))
    print(f"replayed {r['frames_read']} packets in {r['wall_s']} s ({r['packets_per_s']} packets/s) into the TUI; "
          f"event-loop ticks late by median {r['late_ms_median']} ms, p99 {r['late_ms_p99']} ms, "
          f"max {r['late_ms_max']} ms ({r['ticks']} ticks); header and findings refreshed at least every "
          f"{r['refresh_gap_max_s']} s")
    ok = r["late_ms_p99"] <= a.max_late_ms and (r["refresh_gap_max_s"] or 0) <= 1.0
    print("OK" if ok else "REGRESSION: the screen was blocked")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
