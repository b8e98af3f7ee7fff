"""Issue 15: the secrets planted for tests/commands/test_redact_analyze.py (a folded Set-Cookie, an Authorization name
with a NUL, tokens in request targets, on the wire and in the access log) are on no part of the triage desk:
the findings list, the detail pane, the save prompt and what saving reports, the access-log pane."""

from __future__ import annotations

import shutil

import pytest
from textual.widgets import DataTable, Input, Static

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.sources.files import CaptureArg

from ...commands.test_redact_analyze import FOLDED, LOG_TOKEN, NUL_AUTH, WIRE_TOKEN, inputs  # noqa: F401 (a fixture)
from .test_app import wait_for

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="captures are read through tshark")
SECRETS = (FOLDED, NUL_AUTH, WIRE_TOKEN, LOG_TOKEN)


def everything_shown(app) -> str:
    """The text of every Static and DataTable cell and Input of the screen on top."""
    parts = [str(w.render()) for w in app.screen.query(Static)]
    parts += [w.value for w in app.screen.query(Input)]
    for table in app.screen.query(DataTable):
        parts += [str(c) for i in range(table.row_count) for c in table.get_row_at(i)]
    return "\n".join(parts)


async def test_planted_secrets_are_on_no_pane(inputs, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # where the save prompt offers to write
    app = MeshDoctorApp(FileSession([CaptureArg.parse(p) for p in inputs]))
    async with app.run_test(size=(200, 50)) as pilot:
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: "q quits" in str(app.query_one("#status", Static).render())
                       and table.row_count >= 2)
        shown = []
        for row in range(table.row_count):
            table.move_cursor(row=row)
            await pilot.pause(0.1)
            shown.append(everything_shown(app))
            await pilot.press("s")
            await wait_for(pilot, lambda: app.screen.query("#prompt-path"))
            shown.append(everything_shown(app))
            saved = tmp_path / f"evidence-{row}.pcapng"
            app.screen.query_one("#prompt-path", Input).value = str(saved)
            await pilot.press("enter")
            await wait_for(pilot, lambda: saved.exists() or not app.screen.query("#prompt-path"))
            await pilot.pause(0.2)
            shown += [str(n.message) for n in app._notifications]
        await pilot.press("a")
        await wait_for(pilot, lambda: "ACCESS_TOKEN=<redacted>" in everything_shown(app))  # the log's one line
        assert "access log of the files given" in everything_shown(app)
        shown.append(everything_shown(app))
        await pilot.press("escape")
        await pilot.press("q")
    text = "\n".join(shown)
    assert "http-framing" in text and "upstream-timeout" in text and "<redacted>" in text
    for secret in SECRETS:
        assert secret not in text, secret
