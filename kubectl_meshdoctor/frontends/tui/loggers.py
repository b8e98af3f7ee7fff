"""The loggers pane: the sidecar's Envoy log levels, changed with a key and shown only once the proxy confirms; in a
watch, ``v`` raises the loggers the detectors read to debug for the run (and puts them back)."""

from __future__ import annotations

from collections.abc import Callable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Header, Static

from ..shown import one_line
from .footer import KeysFooter
from .plain import PlainStatic, PlainTable

LEVEL_KEYS = {"t": "trace", "d": "debug", "i": "info", "w": "warning", "e": "error", "o": "off"}
_KEY_NAMES = {"escape": "esc"}  # as the footer writes them


def keys_help(bindings: list[Binding]) -> str:
    """Every key of ``bindings`` with what it does, ``t trace  ...  esc/l back``: the footer, cut at 80
    columns, shows only some."""
    return "keys: " + "  ".join("/".join(_KEY_NAMES.get(k, k) for k in b.key.split(",")) + f" {b.description}"
                                for b in bindings)


class LoggersScreen(Screen):
    """``control_of(pod)`` gives a pod's control (Session.loggers; the first pod's for None), which has ``pod``,
    ``levels()`` and ``apply(spec)`` (commands.log_level.LoggerControl), and in a watch ``toggle_run_debug()`` ->
    (levels, what was done) (commands.watch.live_session.RunLoggerControl); they block, so they run in worker
    threads and the table is redrawn from what the proxy answers. ``pods`` are the run's: `p` goes to the next
    pod's sidecar."""

    BINDINGS = [
        *(Binding(key, f"set_level('{level}')", f"{level}", show=key in "dwe") for key, level in LEVEL_KEYS.items()),
        Binding("D", "set_all('debug')", "all debug"),
        Binding("r", "set_all('reset')", "reset to Istio defaults"),
        Binding("v", "run_debug", "detectors' loggers: debug for this run / back"),
        Binding("p", "next_pod", "next pod"),
        Binding("escape,l", "app.pop_screen", "back"),
    ]
    CSS = """
    #loggers-status { height: auto; padding: 0 1; background: $boost; }
    #loggers-keys { height: auto; padding: 0 1; }
    """

    def __init__(self, control_of: Callable[[str | None], object], pods: list[str] = ()) -> None:
        super().__init__()
        self.control_of = control_of
        self.pods = list(pods)
        self.at = 0
        self.control = control_of(None)
        self.levels: dict[str, str] = {}
        self.status = "reading log levels from the proxy ..."

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return len(self.pods) > 1 if action == "next_pod" else True

    def action_next_pod(self) -> None:
        self.at = (self.at + 1) % len(self.pods)
        control = self.control_of(self.pods[self.at])
        if control is None:  # its proxy is not known yet: the pod shown stays
            self.at = self.pods.index(self.control.pod) if self.control.pod in self.pods else 0
            self._set_status(f"the proxy of pod/{one_line(self.pods[self.at])} is not known yet")
            return
        self.control = control
        self.levels = {}
        self.query_one("#loggers", DataTable).clear()
        self._title()
        self._set_status(f"reading log levels of pod/{one_line(control.pod)} ...")
        self._refresh_levels()

    def _title(self) -> None:
        which = f" ({self.at + 1} of {len(self.pods)}; p: next pod)" if len(self.pods) > 1 else ""
        self.sub_title = one_line(f"Envoy loggers of pod/{self.control.pod}") + which

    def compose(self) -> ComposeResult:
        yield Header(icon="")
        yield PlainStatic(self.status, id="loggers-status", markup=False)
        keys = [b for b in self.BINDINGS if b.action != "next_pod" or len(self.pods) > 1]
        yield PlainStatic(keys_help(keys), id="loggers-keys", markup=False)
        table = PlainTable(id="loggers", cursor_type="row", zebra_stripes=True)
        table.add_column("logger", key="logger")
        table.add_column("level", key="level")
        yield table
        yield KeysFooter()

    def on_mount(self) -> None:
        if self.control.pod in self.pods:
            self.at = self.pods.index(self.control.pod)
        self._title()
        self._refresh_levels()

    def _set_status(self, text: str) -> None:
        self.status = text
        self.query_one("#loggers-status", Static).update(text)

    def _show(self, levels: dict[str, str]) -> None:
        table = self.query_one("#loggers", DataTable)
        if list(levels) != list(self.levels):
            row = table.cursor_row
            table.clear()
            for name, level in levels.items():
                table.add_row(name, level, key=name)
            table.move_cursor(row=min(row, len(levels) - 1))
        else:
            for name, level in levels.items():
                if self.levels.get(name) != level:
                    table.update_cell(name, "level", level)
        self.levels = dict(levels)

    @work(thread=True, exclusive=True, group="loggers")
    def _refresh_levels(self) -> None:
        control = self.control
        try:
            levels = control.levels()
        except Exception as e:  # shown, never raised: the proxy may be unreachable
            self.app.call_from_thread(self._shown_if, control, self._set_status,
                                      f"cannot read levels: {str(e).splitlines()[0]}")
            return
        self.app.call_from_thread(self._shown_if, control, self._show, levels)
        which = f" ({self.at + 1} of {len(self.pods)}; p: next pod)" if len(self.pods) > 1 else ""
        # the pod on the status line too: an 80-column title cuts it
        self.app.call_from_thread(self._shown_if, control, self._set_status,
                                  one_line(f"{len(levels)} loggers of pod/{control.pod}") + which
                                  + "; t d i w e o set the selected logger")

    def _shown_if(self, control, show: Callable, *args) -> None:
        if control is self.control:  # a read of the pod left behind (p pressed meanwhile) is not this pane's
            show(*args)

    @work(thread=True, exclusive=True, group="loggers")
    def _apply(self, control, spec: str, what: str) -> None:
        """``control``: the pod's whose table the key was pressed on, taken then (p may come before this runs)."""
        try:
            levels = control.apply(spec)
        except Exception as e:
            self.app.call_from_thread(self._shown_if, control, self._set_status,
                                      f"not changed: {str(e).splitlines()[0]}")
            return
        self.app.call_from_thread(self._shown_if, control, self._show, levels)
        self.app.call_from_thread(self._shown_if, control, self._set_status, f"{what}: confirmed by the proxy")

    def selected_logger(self) -> str | None:
        table = self.query_one("#loggers", DataTable)
        if not table.row_count:
            return None
        return str(table.get_row_at(table.cursor_row)[0])

    def action_set_level(self, level: str) -> None:
        name = self.selected_logger()
        if name is None:
            return
        self._set_status(f"setting {name} to {level} ...")
        self._apply(self.control, f"{name}:{level}", f"{name}: {level}")

    def action_set_all(self, spec: str) -> None:
        self._set_status(f"setting every logger: {spec} ...")
        self._apply(self.control, spec, "every logger: " + ("Istio defaults" if spec == "reset" else spec))

    def action_run_debug(self) -> None:
        toggle = getattr(self.control, "toggle_run_debug", None)
        if toggle is None:
            self._set_status("only a live watch raises the loggers its detectors read, for its run")
            return
        self._set_status("the detectors' loggers: asking the proxy ...")
        self._toggle(self.control, toggle)

    @work(thread=True, exclusive=True, group="loggers")
    def _toggle(self, control, toggle) -> None:
        try:
            levels, said = toggle()
        except Exception as e:
            self.app.call_from_thread(self._shown_if, control, self._set_status,
                                      f"not changed: {str(e).splitlines()[0]}")
            return
        self.app.call_from_thread(self._shown_if, control, self._show, levels)
        self.app.call_from_thread(self._shown_if, control, self._set_status,
                                  said.split(": ", 1)[-1] if said else "nothing to do")
