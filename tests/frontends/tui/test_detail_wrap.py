"""Issue 32 item 5: the detail's evidence wraps under its own text (a hanging indent) and nothing is cut at the
right, at 80x24 (the compact layout: Enter opens the detail full screen) and 160x45, over the lab's collision and
framing recordings. Assertions are on the characters the screen shows, page by page."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.ladder import MIN_NAME
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane
from kubectl_meshdoctor.sources.files import CaptureArg

from .test_app import screen_text, wait_for
from .test_small_screen import shown, words

DATA = Path(__file__).parent.parent.parent / "data"
RECORDINGS = {"collision": ("lab-collision-eth0.pcap", "lab-collision-lo.pcap"),
              "framing": ("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap", "lab-framing-mixed-access.log")}


async def detail_rows(app, pilot) -> list[str]:
    """Every row of the detail pane as drawn, its top to its end (PgDn by PgDn), within the pane."""
    detail = app.query_one(DetailPane)
    rows: dict[int, str] = {}
    while True:
        await pilot.pause(0.1)
        box, top = detail.scrollable_content_region, round(detail.scroll_y)
        for i, line in enumerate(shown(app)[box.y:box.bottom]):
            rows[top + i] = line[box.x:box.right]
        if detail.scroll_y >= detail.max_scroll_y:
            return [rows[k] for k in sorted(rows)]
        await pilot.press("pagedown")


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
@pytest.mark.parametrize("recording", sorted(RECORDINGS))
async def test_evidence_wraps_under_its_own_text_and_nothing_is_cut(recording, size):
    app = MeshDoctorApp(FileSession([CaptureArg.parse(str(DATA / f)) for f in RECORDINGS[recording]]))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: "q quits" in screen_text(app, "#status") and app.selected is not None)
        await pilot.pause(0.6)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.query_one(DetailPane).has_focus)
        f = app.selected
        rows = await detail_rows(app, pilot)
        start = next(i for i, row in enumerate(rows) if row.strip() == "evidence:")
        end = next(i for i in range(start + 1, len(rows)) if not rows[i].strip())
        block = rows[start + 1:end]
        assert len(block) > len(f.evidence)  # something wrapped, or this proves nothing at this size
        for row in block:  # the pane's padding (1), then an item at 2, or its continuation at 4 or more
            lead = len(row) - len(row.lstrip(" "))
            assert lead == 3 or lead >= 5, (lead, row, block)
        said = words(block)
        for e in f.evidence:
            assert " ".join(e.cited().split()) in said, (e.cited(), said)  # whole: nothing cut at the right
        for line in f.access_log:
            assert " ".join(line.split()) in said
        ladder = rows[end:]
        assert any("│" in row for row in ladder)
        drawn = words(ladder)
        for e in (e for e in f.evidence if e.src and e.dst):  # each arrow's frame and name, none cut off unsaid
            name = e.what.split(' (')[0].split(', ')[0][:32]
            # s46: the ports whole first; a name the lanes leave too few columns is cut with "…" (whole above)
            assert f"#{e.frame} {name}" in drawn or f"#{e.frame} {name[:MIN_NAME - 1].rstrip()}" in drawn, drawn
            ports = [endpoint.rpartition(":")[2] for endpoint in (e.src, e.dst)]
            assert f":{ports[0]}→:{ports[1]}" in drawn or f" {ports[0]}→{ports[1]} " in drawn, (ports, drawn)
        await pilot.press("q")
