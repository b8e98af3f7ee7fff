"""What `watch --envoy-debug` did to a sidecar's Envoy log levels, as the report states it: which loggers were
raised, from what to what, for how long, and whether (and by whom) they were put back. A typed part of the
report's Envoy side (core/report_model.py ``SidecarSide.debug``: ``envoy.debug`` in JSON, per pod under
``envoy.per_pod`` when several), one line in ``-o text``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoggerRaise:
    """One logger: the level it had (``before``), the one it was raised to (``raised``), and the one it had when
    the run ended (``after``; None when the proxy could not be asked)."""

    logger: str
    before: str
    raised: str
    after: str | None

    def to_dict(self) -> dict:
        return {"logger": self.logger, "from": self.before, "to": self.raised, "after": self.after}


@dataclass(frozen=True, slots=True)
class LeftBehind:
    """A raise an earlier run left on the pod (its guard gone), found when this run started and put back:
    ``raised_at`` (seconds since the epoch, the pod's clock), ``loggers`` (logger -> the level put back),
    ``restored`` (the proxy confirmed it), ``note`` (what could not be done, one line)."""

    raised_at: float | None
    loggers: dict[str, str]
    restored: bool
    note: str = ""

    def to_dict(self) -> dict:
        return {"raised_at": self.raised_at, "loggers": dict(self.loggers), "restored": self.restored,
                **({"note": self.note} if self.note else {})}


@dataclass(frozen=True, slots=True)
class EnvoyDebugReport:
    """One pod's sidecar. ``asked``: a raise was asked for (--envoy-debug, the TUI's v); ``wanted``: the loggers the
    run's detectors read (Pipeline.envoy_loggers()); ``raised``:
    those changed; ``missing``: names the proxy does not have (skipped); ``unchanged``: already at debug or finer.
    ``raised_at``/``restored_at``: seconds since the epoch of the first raise and the last put-back;
    ``seconds``: how long the loggers were at debug in all (a raise toggled off and on counts its spans);
    ``restored``: every raised logger back at its level (or at one someone set meanwhile); ``restored_by``:
    ``watch`` (at q, Ctrl-C, SIGTERM, --duration, or a toggle), ``debug container`` (the guard, kube/envoy_guard.py)
    or None; ``left``: loggers not put back, with why in ``error``; ``error``: why a raise or a put-back failed
    (one line); ``held_by``: another run holds a raise on this pod (this one raised nothing);
    ``left_behind``: an earlier run's raise found and put back at the start."""

    pod: str
    asked: bool = False
    wanted: tuple[str, ...] = ()
    raised: tuple[LoggerRaise, ...] = ()
    missing: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    raised_at: float | None = None
    restored_at: float | None = None
    seconds: float = 0.0
    restored: bool | None = None
    restored_by: str | None = None
    left: tuple[str, ...] = ()
    error: str | None = None
    held_by: str | None = None
    left_behind: LeftBehind | None = None

    def to_dict(self) -> dict:
        out = {"pod": self.pod, "asked": self.asked, "wanted": list(self.wanted),
               "raised": [r.to_dict() for r in self.raised],
               "missing": list(self.missing), "unchanged": list(self.unchanged), "raised_at": self.raised_at,
               "restored_at": self.restored_at, "seconds": round(self.seconds, 3), "restored": self.restored,
               "restored_by": self.restored_by, "left": list(self.left), "error": self.error}
        if self.held_by:
            out["held_by"] = self.held_by
        if self.left_behind is not None:
            out["left_behind"] = self.left_behind.to_dict()
        return out

    def line(self) -> str:
        """One line: ``envoy debug pod/x: connection, pool, router warning -> debug for 12.3 s, put back by the
        watch``."""
        head = f"envoy debug pod/{self.pod}: "
        parts = []
        if self.left_behind is not None:
            lb = self.left_behind
            parts.append(f"an earlier run's raise of {', '.join(lb.loggers)} was "
                         + ("put back at the start" if lb.restored else f"found, not put back ({lb.note})"))
        if self.raised:
            befores = sorted({r.before for r in self.raised})
            names = ", ".join(r.logger for r in self.raised)
            text = f"{names} {'/'.join(befores)} -> {self.raised[0].raised} for {self.seconds:.1f} s"
            if self.restored:
                text += f", put back by the {self.restored_by or 'watch'}"
            elif self.left:
                text += f", NOT put back: {', '.join(self.left)}" + (f" ({self.error})" if self.error else "")
            else:
                text += ", not confirmed put back" + (f" ({self.error})" if self.error else "")
            parts.append(text)
        elif self.held_by:
            parts.append(f"not raised: {self.held_by}")
        elif self.error:
            parts.append(f"not raised: {self.error}")
        elif self.asked:
            parts.append("nothing to raise (" + "; ".join(
                x for x in (f"already at debug or finer: {', '.join(self.unchanged)}" if self.unchanged else "",
                            f"not in this proxy: {', '.join(self.missing)}" if self.missing else "") if x) + ")")
        if self.raised and self.missing:
            parts.append(f"not in this proxy: {', '.join(self.missing)}")
        return head + ("; ".join(parts) or "nothing done")
