"""Small modal screens of the triage desk: the key help, and a path prompt that never overwrites silently."""

from __future__ import annotations

import os
import textwrap

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from .plain import PlainStatic
from .session import ACCESS_LOG, CLUSTERS, COUNTERS, LOGGERS

# Every key of the app and its panes, in the order a newcomer needs them.
KEYS: tuple[tuple[str, str, str], ...] = (
    ("main", "↑ ↓ / click", "select a problem (one row per kind of finding): its detail, ladder and packets"),
    ("main", "Enter", "open the selected problem's detail (the whole screen below 100x30); Esc goes back"),
    ("main", "PgUp PgDn", "scroll the detail (evidence, ladder, explanation, the fix) once it has the focus"),
    ("main", "[ ]", "step to an older / newer instance of the selected problem (it holds still otherwise)"),
    ("main", "n", "jump to the newest instance of the selected problem"),
    ("main", "/", "filter the packets pane (ip, port, flags, lo/eth0, frame:N; below 100x30 it takes the "
             "screen, Enter with no filter: the selected finding's packets); Esc clears"),
    ("main", "p", "pause / resume the display (a live capture goes on; new findings are held)"),
    ("main", "s", "save the selected finding's packets as pcapng (asks for a path)"),
    ("main", "e", "export the report so far (.md, .json or text; asks for a path)"),
    ("main", "l", "the sidecar's Envoy loggers: change levels"),
    ("main", "c", "the sidecar's Envoy clusters and hosts (offline: the /clusters dumps given)"),
    ("main", "a", "the sidecar's access log (offline: the access-log lines of the logs given)"),
    ("main", "k", "the sidecar's /stats counters that moved since the run began (offline: between the /stats "
                  "dumps given, or since Envoy's start for one dump)"),
    ("main", "Tab", "move between findings, detail and packets"),
    ("main", "?", "this help"),
    ("main", "q", "quit and print the report (live: tcpdump ends in the pod first)"),
    ("loggers", "t d i w e o", "set the selected logger to trace, debug, info, warning, error, off"),
    ("loggers", "D", "set every logger to debug"),
    ("loggers", "r", "reset the loggers to Istio's defaults"),
    ("loggers", "v", "watch: the loggers the detectors read at debug for this run; again: put back (also at q)"),
    ("loggers", "p", "several pods: the next pod's loggers"),
    ("clusters", "f", "read /clusters again now (not for a dump)"),
    ("clusters", "p", "several pods: the next pod's clusters"),
    ("counters", "/", "filter the counters by any part of their name"),
    ("counters", "f", "read /stats again now (not for dumps)"),
    ("counters", "p", "several pods: the next pod's counters"),
    ("access log", "/", "filter lines (a response flag such as UF, a status, any text)"),
    ("access log", "p", "several pods: one pod's lines, the next pod's, then every pod's"),
    ("any pane", "Esc", "back"),
)


_KEY_WIDTH = 13
# The Envoy panes' lines of KEYS: the main screen's key that opens each, and the pane's own section.
_PANE_KEYS = {("main", "l"): LOGGERS, ("main", "c"): CLUSTERS, ("main", "a"): ACCESS_LOG, ("main", "k"): COUNTERS}
_PANE_SECTIONS = {"loggers": LOGGERS, "clusters": CLUSTERS, "access log": ACCESS_LOG, "counters": COUNTERS}
ALL_PANES = frozenset(_PANE_SECTIONS.values())


def offered_keys(offered: frozenset[str] = ALL_PANES) -> list[tuple[str, str, str]]:
    """The lines of KEYS for the Envoy panes in ``offered`` (Session.panes) and every other: a pane not offered
    is not named."""
    return [(pane, key, what) for pane, key, what in KEYS
            if _PANE_KEYS.get((pane, key), _PANE_SECTIONS.get(pane)) in (None, *offered)]


def help_text(width: int = 100, offered: frozenset[str] = ALL_PANES) -> str:
    """KEYS by pane, each key's text wrapped to ``width`` columns under itself (never cut at the right); of the
    Envoy panes only those ``offered``."""
    lines, last = [], None
    for pane, key, what in offered_keys(offered):
        if pane != last:
            lines += ["" if last else "", f"{pane}"]
            last = pane
        lines += textwrap.wrap(f"  {key:<{_KEY_WIDTH}} {what}", max(width, _KEY_WIDTH + 3 + 12),
                               subsequent_indent=" " * (_KEY_WIDTH + 3))
    return "\n".join(lines).strip("\n")


class HelpScreen(ModalScreen[None]):
    """Every key, on top of the main screen, wrapped to the terminal's width and scrolled (↑ ↓, PgUp PgDn, Home
    End, the wheel) when it is taller; any of Esc, ? or q closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%;
                                  border: thick $primary; background: $surface; padding: 0 1; }
    """
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]
    AUTO_FOCUS = "#help-scroll"

    def __init__(self, offered: frozenset[str] = ALL_PANES) -> None:
        """``offered``: the Envoy panes the session offers (Session.panes); the others' keys are not listed."""
        super().__init__()
        self.offered = offered

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-scroll"):
            yield PlainStatic("kubectl meshdoctor: keys (↑ ↓ PgUp PgDn scroll; Esc closes)", classes="title")
            yield PlainStatic(help_text(self._text_width(), self.offered), id="help-keys", markup=False)

    def _text_width(self) -> int:
        # the box's 100 columns or the terminal's, less its border (2), padding (2) and scrollbar (2)
        return min(100, self.app.size.width) - 6

    def on_resize(self) -> None:
        self.query_one("#help-keys", PlainStatic).update(help_text(self._text_width(), self.offered))

    def action_dismiss(self, result=None) -> None:
        self.dismiss(None)


class PathPrompt(ModalScreen[tuple[str, bool] | None]):
    """Ask for a file path; returns (path, overwrite). An existing file needs Enter a second time on the same
    path, with a warning shown in between: nothing is overwritten silently. Esc cancels (None)."""

    DEFAULT_CSS = """
    PathPrompt { align: center middle; }
    PathPrompt > Vertical { width: 90; max-width: 100%; height: auto; border: thick $primary; background: $surface;
                             padding: 0 1; }
    #prompt-warning { color: $warning; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    AUTO_FOCUS = "#prompt-path"

    def __init__(self, title: str, default: str) -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self._confirm: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield PlainStatic(self.title_text, markup=False)
            yield Input(self.default, id="prompt-path")
            yield PlainStatic("Enter to save, Esc to cancel", id="prompt-warning", markup=False)

    @on(Input.Submitted, "#prompt-path")
    def _submitted(self, event: Input.Submitted) -> None:
        path = os.path.expanduser(event.value.strip())
        if not path:
            return
        if os.path.isdir(path):
            self.query_one("#prompt-warning", Static).update(f"{path} is a directory: give a file name")
            return
        if os.path.exists(path) and self._confirm != path:
            self._confirm = path
            self.query_one("#prompt-warning", Static).update(
                f"{path} exists: Enter again to overwrite it, or change the path")
            return
        self.dismiss((path, os.path.exists(path)))

    def action_cancel(self) -> None:
        self.dismiss(None)
