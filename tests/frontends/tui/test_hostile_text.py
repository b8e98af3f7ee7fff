"""Issue 29, item 1: text from the traffic on every pane, at 80x24 and 160x45. A request target or a header is
the traffic's: Rich markup in it (`[/]`, `[bold]`, `[@click=app.quit]`) is shown as written and neither ends
the app nor acts; a control byte (an escape sequence, a BEL, C1 CSI) or a bidirectional override never reaches
the terminal, but shows as its escape; a huge line is cut, saying so. What is asserted is what the screen's
compositor would write to the terminal."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from kubectl_meshdoctor.commands.analyze import FileSession
from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
from kubectl_meshdoctor.sources.files import CaptureArg

from .test_app import wait_for

UF = ('[2025-06-12T08:14:07.031Z] "GET {path} HTTP/1.1" 503 UF upstream_reset_before_response_started'
      '{{remote_connection_failure|delayed_connect_error:_Connection_refused}} - "delayed_connect_error:_Connection_'
      'refused" 0 167 0 - "-" "{agent}" "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b9{n}" "orders.shop.svc.cluster.local:5002" '
      '"10.244.1.23:5002" inbound|5002|| - 10.244.1.23:5002 10.244.2.7:5193{n} outbound_.5002_._.orders default')
HOSTILE = {  # path, user-agent
    "/p[/x]": "curl/8 [/]",
    "/x[@click=app.quit]y": "[bold]agent[/bold]",
    "/t\x1b]0;owned\x07z": "a\x1b[2Jb\x9b31mc",
    "/bidi\u202egnp.exe": "ok\x00nul",
    "/huge/" + "a" * 100_000: "z" * 50_000,
}
# What must never be written to the terminal: ESC, BEL, C1 CSI, NUL, the override.
UNSAFE = ("\x1b", "\x07", "\x9b", "\x00", "\u202e")


def screen_output(app) -> str:
    """The characters the compositor renders for the whole screen (what a real terminal would be sent)."""
    update = app.screen._compositor.render_update(full=True)
    return "".join(seg.text for strip in update.strips for seg in strip)


@pytest.fixture
def hostile_log(tmp_path):
    log = tmp_path / "istio\x1b]0;owned\x07\x1b[31m-proxy.log"  # the header shows the files' names
    lines = [UF.format(path=p, agent=a, n=i) for i, (p, a) in enumerate(HOSTILE.items())]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return log


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_traffics_text_is_shown_as_text_on_every_pane(hostile_log, size):
    app = MeshDoctorApp(FileSession([CaptureArg.parse(str(hostile_log))]))
    async with app.run_test(size=size) as pilot:
        table = app.query_one("#findings", DataTable)
        await wait_for(pilot, lambda: table.row_count >= 1)
        shown = []
        for row in range(table.row_count):
            table.move_cursor(row=row)
            await pilot.pause(0.1)
            shown.append(screen_output(app))
        await pilot.press("a")  # the access-log pane
        await wait_for(pilot, lambda: app.screen.query("#access-log")
                       and app.screen.query_one("#access-log", DataTable).row_count == len(HOSTILE))
        access = app.screen.query_one("#access-log", DataTable)
        cells = [str(c) for i in range(access.row_count) for c in access.get_row_at(i)]
        for i in range(access.row_count):
            access.move_cursor(row=i)
            await pilot.pause(0.05)
            shown.append(screen_output(app))
        await pilot.press("escape")
        assert app.is_running, "markup in the traffic acted"
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_value is not None or not app.is_running)
    assert app.return_value is not None and app.return_value.exit_code() == 1
    text = "\n".join(shown)
    assert not [ch for ch in UNSAFE if ch in text], [ch for ch in UNSAFE if ch in text]
    assert "GET /p[/x]" in cells and "GET /x[@click=app.quit]y" in cells, cells
    assert "GET /t\\x1b]0;owned\\x07z" in cells and "GET /bidi\\u202egnp.exe" in cells, cells
    assert any(c.startswith("GET /huge/aaa") and c.endswith("more characters)") for c in cells), cells
