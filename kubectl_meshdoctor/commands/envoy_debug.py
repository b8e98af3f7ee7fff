"""`watch --envoy-debug`: the Envoy loggers the run's detectors read raised to debug on a pod's sidecar, for the run
only, and put back when it ends, whatever ends it.

Only the loggers the loaded detectors read are raised (Pipeline.envoy_loggers(): those they declare and, when one
reads Envoy's requests, the loggers a request's story is made of, envoy/story.py STORY_LOGGERS), each checked
against the list the proxy itself gives (POST /logging; a name it does not have is skipped and said), and only
those less verbose than debug. The levels found are recorded by a guard in the debug container before anything is
raised (kube/envoy_guard.py), so they come back:

- at q, Ctrl-C, SIGTERM or the end of --duration: the watch POSTs them back itself, checks the proxy lists them so,
  and tells the guard to stand down;
- when the watch is killed (SIGKILL, a second Ctrl-C) or its connection hangs: the guard does it, in the pod,
  when the watch's stream ends or its heartbeat stops, and at the latest at the run's bound;
- when the guard was lost too: the next `watch` or `log-level` on the pod finds its record and does it, and says so.

A logger someone set to another level during the run is left as they set it. Sources: Envoy
source/server/admin/logs_handler.cc (/logging), istio/istio istioctl/pkg/proxyconfig/proxyconfig.go (one POST per
logger, as here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kubectl_meshdoctor.envoy.clusters import FormatError
from kubectl_meshdoctor.envoy.logging import LEVELS, parse_logging
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.kube.client import Kube, KubeError, api_call
from kubectl_meshdoctor.kube.envoy_guard import (
    Guard,
    GuardRecord,
    clear_record,
    container_ends_at,
    read_record,
    record_path,
)
from kubectl_meshdoctor.core.envoy_debug_report import EnvoyDebugReport, LeftBehind, LoggerRaise

RAISED = "debug"
MIN_BOUND_S = 60  # a guard with less time than this before its bound is not worth a raise
CONTAINER_MARGIN_S = 30  # the guard's bound comes this long before the debug container's sleep ends


def read_levels(admin: EnvoyAdmin) -> dict[str, str]:
    """The proxy's loggers and levels (POST /logging with no parameters lists them). Raises KubeError."""
    resp = admin.post("/logging")
    if resp.status != 200:
        raise KubeError(f"POST /logging answered {resp.status}")
    try:
        return parse_logging(resp.body)
    except FormatError as e:
        raise KubeError(str(e)) from None


def put_back(admin: EnvoyAdmin, levels: list[tuple[str, str]],
             raised: str = RAISED) -> tuple[dict[str, str], list[str]]:
    """POST each (logger, level) whose logger is still at ``raised`` (one someone set to another level meanwhile
    is left as set) -> (the levels the proxy lists afterwards, the loggers still at ``raised``). Raises
    KubeError when the proxy cannot be reached."""
    now = read_levels(admin)
    for name, level in levels:
        if now.get(name) == raised:
            admin.post("/logging", f"{name}={level}")
    after = read_levels(admin)
    return after, [name for name, _ in levels if after.get(name) == raised]


def _clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts)) if ts else "an unknown time"


def restore_left_behind(kube: Kube, pod, container: str,
                        admin: EnvoyAdmin) -> tuple[LeftBehind | None, GuardRecord | None, str | None]:
    """Look in ``container`` (a running meshdoctor-* debug container of ``pod``) for a raise an earlier run left:
    if its guard no longer runs, put its levels back and remove its record. -> (what was found and done, the record
    of a guard that still runs (another run's live raise: left alone), one line saying what happened or None).
    Raises KubeError when the debug container or the proxy cannot be reached."""
    name = pod.metadata.name
    record = read_record(kube, pod.metadata.namespace, name, container, record_path(pod))
    if record is None:
        return None, None, None
    names = ", ".join(n for n, _ in record.restore)
    if record.alive:
        return None, record, (f"pod/{name}: a meshdoctor watch holds {names} at {record.level} since "
                              f"{_clock(record.raised_at)}; its guard in {container} puts them back when it ends")
    after, left = put_back(admin, list(record.restore), record.level)
    note = f"still at {record.level}: {', '.join(left)}" if left else ""
    if not left:
        clear_record(kube, pod.metadata.namespace, name, container, record)
    found = LeftBehind(record.raised_at, {n: lvl for n, lvl in record.restore}, not left, note)
    back = ", ".join(f"{n} {after.get(n, '?')}" for n, _ in record.restore)
    said = (f"pod/{name}: an earlier meshdoctor watch left {names} at {record.level} (raised "
            f"{_clock(record.raised_at)}; its guard is gone): " + (f"put back ({back})" if not left else
                                                                    f"NOT put back, {note}"))
    return found, None, said


class EnvoyDebug:
    """One pod's raise for one run. Every method blocks (admin calls, execs): call them from a worker thread. They
    never raise: what went wrong is in ``problems`` and the report (a raise that failed is a problem line, never
    the end of the run)."""

    def __init__(self, kube: Kube, pod, container: str, admin: EnvoyAdmin, wanted: tuple[str, ...], admin_port: int,
                 run_ends_at: float, progress: Callable[[str], None] = lambda s: None) -> None:
        self.kube, self.pod, self.container, self.admin = kube, pod, container, admin
        self.name = pod.metadata.name
        self.wanted = tuple(wanted)
        self.admin_port = admin_port
        self.run_ends_at = run_ends_at
        self.progress = progress
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._asked = False
        self._closed = False
        self._guard: Guard | None = None
        self._raised: dict[str, str] = {}  # in effect now: logger -> the level it had
        self._changes: dict[str, LoggerRaise] = {}
        self._missing: tuple[str, ...] = ()
        self._unchanged: tuple[str, ...] = ()
        self._first: float | None = None
        self._since: float | None = None
        self._seconds = 0.0
        self._restored_at: float | None = None
        self._restored: bool | None = None
        self._restored_by: str | None = None
        self._left: tuple[str, ...] = ()
        self._error: str | None = None
        self._held_by: str | None = None
        self._left_behind: LeftBehind | None = None

    # -- the run ---------------------------------------------------------------------------------------------
    def start(self, raise_now: bool, look_back: bool = True) -> None:
        """At the start of a run: put back a raise an earlier run left behind (``look_back``: the debug container
        was there before this run; a new one holds no record), then raise if ``raise_now``."""
        try:
            found, held, said = (restore_left_behind(self.kube, self.pod, self.container, self.admin) if look_back
                                 else (None, None, None))
        except KubeError as e:
            found, held, said = None, None, None
            if raise_now:  # without the guard's record there is no safe raise either: raise_levels says why
                self.problems.append(f"could not look for a raise an earlier run left: {str(e).splitlines()[0]}")
        self._left_behind = found
        if held is not None and said:
            self._held_by = said.split(": ", 1)[-1]
        if said:
            self.progress(said)
            if found is not None:  # an incident met and ended: said in the report's problems, never only on a screen
                self.problems.append(said.split(": ", 1)[-1])
        if raise_now:
            self.raise_levels()

    def raise_levels(self) -> str:
        """Raise the wanted loggers to debug -> one line saying what was done."""
        with self._lock:
            self._asked = True
            said = self._raise()
        self.progress(said)
        return said

    def restore(self, by: str = "watch") -> str:
        """Put the raised loggers back -> one line saying what was done ("" when nothing was raised)."""
        with self._lock:
            said = self._restore(by)
        if said:
            self.progress(said)
        return said

    def finish(self) -> str:
        """The run is over: put back what is raised; no raise after this (a late key press in the TUI)."""
        with self._lock:
            self._closed = True
        return self.restore("watch")

    def toggle(self) -> str:
        """Raise when nothing is raised, else put back (the TUI's key) -> one line."""
        with self._lock:
            raised = bool(self._raised) and not self._guard_gone()
        return self.restore("watch") if raised else self.raise_levels()

    def abandon(self) -> None:
        """The run is being torn down without a chance to wait: let the guard put the levels back (it does so at
        once in the pod when its stdin ends)."""
        guard = self._guard
        if guard is not None and self._raised:
            guard.abandon()

    def report(self) -> EnvoyDebugReport | None:
        """What was done, for the report's ``envoy.debug``; None when nothing was asked or found."""
        with self._lock:
            self._guard_gone()
            if not (self._asked or self._left_behind or self._held_by):
                return None
            since = self._seconds + (time.time() - self._since if self._since else 0.0)
            return EnvoyDebugReport(
                self.name, self._asked, self.wanted, tuple(self._changes.values()), self._missing, self._unchanged,
                self._first, self._restored_at, since, self._restored, self._restored_by, self._left, self._error,
                self._held_by, self._left_behind)

    # -- inside (under the lock) ------------------------------------------------------------------------------
    def _fail(self, why: str) -> str:
        self._error = why
        self.problems.append(f"--envoy-debug: {why}")
        return f"pod/{self.name}: loggers not raised: {why}"

    def _raise(self) -> str:
        if self._closed:
            return f"pod/{self.name}: the run is over: nothing raised"
        if self._raised and not self._guard_gone():
            return f"pod/{self.name}: {', '.join(self._raised)} already at {RAISED}"
        if self._held_by:
            return self._fail(self._held_by)
        try:
            levels = read_levels(self.admin)
        except KubeError as e:
            return self._fail(f"Envoy admin not reachable: {str(e).splitlines()[0]}")
        self._missing = tuple(n for n in self.wanted if n not in levels)
        self._unchanged = tuple(n for n in self.wanted if n in levels and _finer_or_equal(levels[n]))
        up = [n for n in self.wanted if n in levels and not _finer_or_equal(levels[n])]
        missing = f" (this proxy has no {', '.join(self._missing)}: skipped)" if self._missing else ""
        if not up:
            return f"pod/{self.name}: nothing to raise{missing}"
        try:
            bound = self._bound()
            guard = Guard(self.kube, self.pod.metadata.namespace, self.name, self.container, record_path(self.pod),
                          self.admin_port, bound, RAISED, [(n, levels[n]) for n in up])
            guard.arm()
        except (KubeError, ValueError) as e:
            return self._fail(f"no guard to put them back if this watch dies: {str(e).splitlines()[0]}")
        try:
            for n in up:
                resp = self.admin.post("/logging", f"{n}={RAISED}")
                if resp.status != 200:
                    raise KubeError(f"POST /logging?{n}={RAISED} answered {resp.status}")
            after = read_levels(self.admin)
        except KubeError as e:
            said = guard.release()  # whatever went up comes down again, in the pod
            return self._fail(f"raising failed ({str(e).splitlines()[0]}); the guard: {said or 'no answer heard'}")
        now = time.time()
        self._guard = guard
        self._raised = {n: levels[n] for n in up}
        for n in up:
            old = self._changes.get(n)
            self._changes[n] = LoggerRaise(n, old.before if old else levels[n], RAISED, after.get(n))
        self._first = self._first or now
        self._since = now
        self._restored = False
        self._error = None
        return (f"pod/{self.name}: raised {', '.join(up)} to {RAISED} for this run (bound {bound} s; put back when "
                f"it ends){missing}")

    def _bound(self) -> int:
        """Seconds the guard may wait at most: the run's bound, and before the debug container ends."""
        now = time.time()
        ends = self.run_ends_at
        pod = api_call(self.kube, f"reading pod/{self.name}", self.kube.core.read_namespaced_pod, self.name,
                       self.pod.metadata.namespace)
        gone = container_ends_at(pod, self.container)
        if gone is not None:
            ends = min(ends, gone - CONTAINER_MARGIN_S)
        bound = int(ends - now)
        if bound < MIN_BOUND_S:
            raise KubeError(f"the debug container {self.container} ends in {int((gone or ends) - now)} s (its --ttl): "
                            f"too soon to hold a raise it must undo; a watch after it has ended adds a fresh one")
        return bound

    def _guard_gone(self) -> bool:
        """Whether the guard ended on its own (its bound, its stream lost) and put the levels back: then the raise
        is over, and said so once."""
        guard = self._guard
        if guard is None or not guard.ended.is_set() or not self._raised or guard.asked:
            return False
        said = guard.said or guard.error or "its stream ended"
        self._end_span(restored=said.startswith("restored"), by="debug container", left=())
        if not self._restored:
            self._error = f"the guard in {self.container}: {said}"
            self.problems.append(f"--envoy-debug: {self._error}")
        return True

    def _end_span(self, restored: bool, by: str, left: tuple[str, ...],
                  after: dict[str, str] | None = None) -> None:
        now = time.time()
        if self._since is not None:
            self._seconds += now - self._since
        self._since = None
        for n in self._raised:
            old = self._changes[n]
            self._changes[n] = LoggerRaise(n, old.before, old.raised, (after or {}).get(n, old.before if restored
                                                                                      else None))
        self._raised = {}
        self._guard = None
        self._restored_at, self._restored, self._restored_by, self._left = now, restored, by if restored else None, left

    def _restore(self, by: str) -> str:
        if not self._raised or self._guard_gone():
            return ""
        guard, names = self._guard, ", ".join(self._raised)
        try:
            after, left = put_back(self.admin, list(self._raised.items()))
        except KubeError as e:
            said = guard.release() if guard else None
            ok = bool(said and said.startswith("restored"))
            self._end_span(ok, "debug container", () if ok else tuple(self._raised))
            if not ok:
                self._error = (f"Envoy admin not reachable ({str(e).splitlines()[0]}); the guard in {self.container}: "
                               f"{said or 'no answer heard'}")
                self.problems.append(f"--envoy-debug: {self._error}")
            return f"pod/{self.name}: {names} " + ("put back by the guard in the debug container" if ok
                                                    else f"not confirmed put back: {self._error}")
        if left:  # the proxy kept them at debug: the guard tries too, and the next run will
            said = guard.release() if guard else None
            self._end_span(False, by, tuple(left), after)
            self._error = f"the proxy kept {', '.join(left)} at {RAISED}; the guard: {said or 'no answer heard'}"
            self.problems.append(f"--envoy-debug: {self._error}")
            return f"pod/{self.name}: {self._error}"
        if guard is not None:
            guard.stand_down()
        self._end_span(True, by, (), after)
        return f"pod/{self.name}: put back " + ", ".join(f"{n} {after.get(n, '?')}" for n in self._changes)


def _finer_or_equal(level: str) -> bool:
    """Whether ``level`` already logs what debug logs (debug, trace); an unknown spelling counts as not."""
    return level in LEVELS and LEVELS.index(level) <= LEVELS.index(RAISED)
