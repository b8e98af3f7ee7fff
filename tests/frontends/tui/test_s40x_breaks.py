"""Defects of the triage desk found by trying to break it at small and odd terminal sizes (issue 32 follow-up).
Each was a failing test (xfail, strict) when found; each is fixed, and the test says what the user sees."""

from __future__ import annotations

from .test_small_screen import shown, words
from .test_triage import collision_app, ready


async def test_help_in_a_40_column_pane_wraps_each_key_once():
    app = collision_app()
    async with app.run_test(size=(40, 20)) as pilot:
        await ready(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.5)
        lines = [line.strip("█▀▄▁▂▃▄▅▆▇ ") for line in shown(app)]
        assert "select a problem (one row per kind" in " ".join(words(lines).split())
        # No line of the help is a lone word left by a second wrap of an already wrapped line.
        assert not any(line in ("(one", "(the", "detail,") for line in lines), lines
        await pilot.press("escape")
        await pilot.press("q")


async def test_export_over_an_existing_file_at_80x24_shows_the_whole_warning_in_the_box():
    """The path prompt was 90 columns wide on an 80-column terminal: its right border gone and the warning cut
    to '... or change' (fixed with a max-width, one line)."""
    import os
    import tempfile

    app = collision_app()
    with tempfile.TemporaryDirectory(prefix="s40x-") as tmp:
        existing = os.path.join(tmp, "r.md")
        with open(existing, "w") as fh:
            fh.write("old")
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(app, pilot)
            await pilot.press("e")
            await pilot.pause(0.3)
            box = app.screen.query_one("#prompt-path")
            box.value = existing
            await pilot.press("enter")
            await pilot.pause(0.3)
            lines = shown(app)
            assert "exists: Enter again to overwrite it, or change the path" in words(lines)
            boxed = [line for line in lines if line.startswith("█")]
            assert boxed and all(line.rstrip().endswith("█") for line in boxed), boxed  # right border drawn
            await pilot.press("escape")
            await pilot.press("q")
        with open(existing) as fh:
            assert fh.read() == "old"


async def test_a_dozen_files_at_80x24_leave_the_findings_list_on_the_screen():
    import glob
    from pathlib import Path

    from kubectl_meshdoctor.commands.analyze import FileSession
    from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
    from kubectl_meshdoctor.sources.files import CaptureArg

    from .test_app import wait_for

    mesh = Path(__file__).parent.parent.parent / "data" / "envoy-1.40-mesh"
    files = sorted(f for s in ("framing", "refused", "stale-keepalive") for f in glob.glob(f"{mesh}/{s}/*/*.pcap"))
    assert len(files) == 12
    app = MeshDoctorApp(FileSession([CaptureArg.parse(f) for f in files]))
    async with app.run_test(size=(80, 24)) as pilot:
        # the status's text (at 80x24 the screen cuts its second row after the verdict: s44)
        await wait_for(pilot, lambda: "q quits" in str(app.query_one("#status").render()), seconds=60)
        await pilot.pause(0.3)
        assert app.query_one("#findings").region.height >= 10
        assert any("▶" in line for line in shown(app)), shown(app)  # the selected problem is in sight
        await pilot.press("q")


async def test_the_fix_yaml_at_80x24_wraps_its_comments_as_comments():
    from kubectl_meshdoctor.frontends.tui.detail_pane import DetailPane

    from .test_app import wait_for

    app = collision_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.press("enter")
        detail = app.query_one(DetailPane)
        await wait_for(pilot, lambda: detail.has_focus)
        seen: list[str] = []
        while detail.scroll_y < detail.max_scroll_y:
            seen += shown(app)
            await pilot.press("pagedown")
            await pilot.pause(0.05)
        seen += shown(app)
        tail = [line.strip() for line in seen if "excluded port)" in line or "bypasses Envoy" in line]
        assert tail and all(line.startswith("#") for line in tail), tail
        # s44: a comment its writer broke over two lines reads as one, wrapped under itself, none back at "# "
        lines = [line.strip(" ▁▂▃▄▅▆▇█") for line in seen]
        at = next(i for i, line in enumerate(lines) if line.startswith("# in the client: connect()"))
        assert lines[at + 1].startswith("#   connection gets an ephemeral port of its own"), lines[at:at + 3]
        assert not any(line.startswith("# port of its own") for line in lines)
        await pilot.press("q")
