"""The guard that puts a sidecar's Envoy log levels back when the watch that raised them is gone.

`watch --envoy-debug` raises some of Envoy's loggers to debug for its run (commands/envoy_debug.py). A proxy left
at debug is an incident of its own (every request writes dozens of lines), so the levels must come back even when
the watch cannot do it: SIGKILLed, its laptop gone to sleep, its network cut. Before anything is raised, a small
shell script starts by exec in the debug container (which shares the pod's network namespace, so Envoy's admin
is at 127.0.0.1:PORT there, as kube/admin.py reaches it through a port-forward). It

- writes a record of the levels it found (``/tmp/meshdoctor-envoy-debug-<pod uid>`` in the debug container: the
  container outlives the watch, and the next run, from any machine, reads it by exec), and says ``armed``;
- reads one byte at a time from its stdin, the watch's heartbeat (``h`` every HEARTBEAT_S); ``d`` means the watch
  put the levels back itself: it removes the record and ends (``stood down``);
- on its stdin's end (the watch's stream closed: it exited, or died and took its connection with it, as the
  tcpdump dead-man's switch relies on, live/pod_script.py), on SILENCE_S without a heartbeat (a connection that
  hangs), at its bound (the run's own, and before the debug container's sleep ends), or on SIGTERM/SIGINT/SIGHUP,
  it POSTs the recorded level back to every logger still at the raised level, checks Envoy lists them so,
  removes the record and says ``restored (why)``. A logger someone set to another level meanwhile is left as set.

If the guard itself is lost (killed, the container's processes gone), the record stays, and the next `watch` or
`log-level` on the pod finds a record whose guard no longer runs and puts the levels back (CHECK_SCRIPT).
Tools: sh, dd, timeout, date, grep, sed, and curl or wget (nicolaka/netshoot has them all; an image with neither
curl nor wget is refused before anything is raised).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from kubernetes.stream import stream as k8s_stream
from kubernetes.stream import ws_client

from .client import Kube, KubeError, api_error_message

HEARTBEAT_S = 5.0  # the watch writes a heartbeat this often
SILENCE_S = 20  # seconds without a heartbeat after which the guard takes the watch for gone
MARK = "meshdoctor-envoy-guard"  # the guard's $0: how a later run tells its process from a reused pid
_NAME = re.compile(r"[a-z0-9_]{1,64}")

# BusyBox's wget (1.35) segfaults on -T: `timeout` bounds it instead.
_POST = (
    'post() { if [ "$via" = curl ]; then curl -s -m 5 -X POST "http://$host:$port/logging$1"; '
    'else timeout 10 wget -q -O - --post-data= "http://$host:$port/logging$1"; fi; }; '
)
GUARD_SCRIPT = (
    "trap '' PIPE; rec=$1 port=$2 bound=$3 quiet=$4 raised=$5; shift 5; "
    'if command -v curl >/dev/null 2>&1; then via=curl; elif command -v wget >/dev/null 2>&1; then via=wget; '
    'else echo "refused: neither curl nor wget in the debug container to put the levels back with"; exit 3; fi; '
    + _POST +
    'host=; for h in 127.0.0.1 "[::1]"; do host=$h; post "" 2>/dev/null | grep -q "active loggers:" && break; '
    'host=; done; [ -n "$host" ] || { echo "refused: Envoy admin not reachable on port $port from the debug '
    'container"; exit 3; }; '
    'if [ -f "$rec" ]; then old=$(sed -n "s/^guard //p" "$rec"); '
    'if [ -n "$old" ] && grep -q ' + MARK + ' "/proc/$old/cmdline" 2>/dev/null; then echo "busy $old"; exit 4; fi; '
    'echo "refused: a record of an earlier raise is still there: $rec"; exit 5; fi; '
    'now=$(date +%s); end=$((now + bound)); tmp="$rec.$$"; '
    '{ echo "meshdoctor envoy-debug 1"; echo "guard $$"; echo "raised $now"; echo "bound $end"; '
    'echo "level $raised"; for p in "$@"; do echo "restore $p"; done; } >"$tmp" 2>/dev/null '
    '&& mv -f "$tmp" "$rec" || { rm -f "$tmp"; echo "refused: cannot write $rec in the debug container"; exit 3; }; '
    "why=; trap 'why=signalled' TERM INT HUP; echo armed; "
    'while [ -z "$why" ]; do now=$(date +%s); t=$((end - now)); [ "$t" -gt "$quiet" ] && t=$quiet; '
    '[ "$t" -gt 0 ] || { why="its bound"; break; }; '
    'b=$(timeout "$t" dd bs=1 count=1 2>/dev/null); rc=$?; [ -n "$why" ] && break; '
    'case "$b" in h) ;; d) rm -f "$rec"; echo "stood down"; exit 0 ;; '
    '*) if [ "$rc" -eq 0 ]; then why="the watch\'s stream ended"; '
    'elif [ "$(date +%s)" -ge "$end" ]; then why="its bound"; else why="no heartbeat for ${quiet} s"; fi ;; '
    'esac; done; '
    'for i in 1 2 3 4 5; do cur=$(post "" 2>/dev/null); case "$cur" in *"active loggers:"*) break ;; esac; '
    'cur=; sleep 1; done; '
    '[ -n "$cur" ] || { echo "not restored: Envoy admin not reachable ($why)"; exit 1; }; '
    'for p in "$@"; do printf "%s\\n" "$cur" | grep -qx " *${p%%=*}: $raised" && post "?$p" >/dev/null 2>&1; done; '
    'cur=$(post "" 2>/dev/null); left=; for p in "$@"; do '
    'printf "%s\\n" "$cur" | grep -qx " *${p%%=*}: $raised" && left="$left ${p%%=*}"; done; '
    'case "$cur" in *"active loggers:"*) ;; *) left=" (unconfirmed)";; esac; '
    'if [ -z "$left" ]; then rm -f "$rec"; echo "restored ($why)"; exit 0; fi; '
    'echo "not restored:$left ($why)"; exit 1'
)
# What a later run reads: the record, then whether its guard still runs.
CHECK_SCRIPT = (
    '[ -f "$1" ] || exit 0; cat "$1"; pid=$(sed -n "s/^guard //p" "$1"); '
    'if [ -n "$pid" ] && grep -q ' + MARK + ' "/proc/$pid/cmdline" 2>/dev/null; then echo "state alive"; '
    'else echo "state gone"; fi'
)
# Removes the record of a guard that no longer runs (never a live guard's, named by its pid).
CLEAR_SCRIPT = '[ "$(sed -n "s/^guard //p" "$1" 2>/dev/null)" = "$2" ] && rm -f "$1"; exit 0'


def record_path(pod) -> str:
    """Where the record of ``pod``'s raise lives in its debug container (one pod's debug containers share nothing
    else; a pod's uid also keeps pods apart where containers share a filesystem, as in the lab)."""
    uid = getattr(pod.metadata, "uid", None) or f"{pod.metadata.namespace}_{pod.metadata.name}"
    return "/tmp/meshdoctor-envoy-debug-" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(uid))


@dataclass(frozen=True, slots=True)
class GuardRecord:
    """A raise as its guard recorded it: ``guard`` (its pid in the pod), ``alive`` (it still runs), ``raised_at``
    and ``bound_at`` (seconds since the epoch, by the pod's clock), the raised ``level`` and ``restore``: each
    raised logger with the level it had."""

    path: str
    guard: int | None
    alive: bool
    raised_at: float | None
    bound_at: float | None
    level: str
    restore: tuple[tuple[str, str], ...]


def parse_record(path: str, text: str) -> GuardRecord | None:
    """CHECK_SCRIPT's output -> the record, None when there is none (or it is not one of ours)."""
    fields: dict[str, str] = {}
    restore = []
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "restore":
            name, _, level = value.partition("=")
            if _NAME.fullmatch(name) and _NAME.fullmatch(level):
                restore.append((name, level))
        elif key:
            fields.setdefault(key, value.strip())
    if not text.startswith("meshdoctor envoy-debug") or "state" not in fields:
        return None

    def num(key: str) -> float | None:
        return float(fields[key]) if fields.get(key, "").isdigit() else None

    guard = num("guard")
    return GuardRecord(path, int(guard) if guard is not None else None, fields["state"] == "alive", num("raised"),
                       num("bound"), fields.get("level", "debug"), tuple(restore))


def _exec(kube: Kube, namespace: str, pod: str, container: str, script: str, *args: str) -> str:
    try:
        return k8s_stream(kube.streaming_core().connect_get_namespaced_pod_exec, pod, namespace, container=container,
                          command=["sh", "-c", script, "meshdoctor-check", *args], stdin=False, stdout=True,
                          stderr=False, tty=False, _request_timeout=kube.request_timeout_s)
    except Exception as e:
        raise KubeError(f"exec in {container} of pod/{pod}: {api_error_message(e)}") from None


def read_record(kube: Kube, namespace: str, pod: str, container: str, path: str) -> GuardRecord | None:
    """The record of a raise in ``container`` (a debug container of ``pod``), None when there is none. Raises
    KubeError when the exec is refused."""
    return parse_record(path, _exec(kube, namespace, pod, container, CHECK_SCRIPT, path))


def clear_record(kube: Kube, namespace: str, pod: str, container: str, record: GuardRecord) -> None:
    """Remove ``record`` (its guard gone, its levels put back). Raises KubeError when the exec is refused."""
    _exec(kube, namespace, pod, container, CLEAR_SCRIPT, record.path, str(record.guard or ""))


def container_ends_at(pod, container: str) -> float | None:
    """When ``container`` (an ephemeral container running ``sleep N``, kube/debug.py) ends by itself, in seconds
    since the epoch; None when that cannot be told."""
    spec = next((c for c in (pod.spec.ephemeral_containers or []) if c.name == container), None)
    status = next((s for s in ((pod.status.ephemeral_container_statuses or []) if pod.status else [])
                   if s.name == container), None)
    command = list((spec.command or []) + (spec.args or [])) if spec is not None else []
    started = status.state.running.started_at if status and status.state and status.state.running else None
    if len(command) != 2 or command[0] != "sleep" or not command[1].isdigit() or started is None:
        return None
    return started.timestamp() + int(command[1])


class Guard:
    """The guard of one raise, over an exec stream held open for the run (a thread of its own writes the heartbeat
    and reads what the guard says). ``said`` is its last line; ``ended`` is set when its stream is over."""

    def __init__(self, kube: Kube, namespace: str, pod: str, container: str, path: str, admin_port: int,
                 bound_s: int, level: str, restore: list[tuple[str, str]]) -> None:
        bad = [n for pair in restore for n in pair if not _NAME.fullmatch(n)] + \
            ([level] if not _NAME.fullmatch(level) else [])
        if bad:
            raise ValueError(f"not a logger or level name: {bad[0]!r}")
        self.kube, self.namespace, self.pod, self.container, self.path = kube, namespace, pod, container, path
        self.command = ["sh", "-c", GUARD_SCRIPT, MARK, path, str(int(admin_port)), str(max(1, int(bound_s))),
                        str(SILENCE_S), level, *(f"{n}={lvl}" for n, lvl in restore)]
        self.said: str | None = None
        self.ended = threading.Event()
        self.armed = threading.Event()
        self.error: str | None = None
        self._ask: str | None = None  # "d": stand down; "eof": close stdin; "close": drop the stream
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float = 30.0) -> None:
        """Start the guard and wait until it has written its record. Raises KubeError with its reason (exec
        refused, no curl or wget, admin not reachable from the container, a raise already held) otherwise."""
        self._thread = threading.Thread(target=self._run, name=f"envoy-guard-{self.pod}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.armed.is_set() and not self.ended.is_set() and time.monotonic() < deadline:
            self.armed.wait(0.1)
        if not self.armed.is_set():
            why = self.error or self.said or f"it did not answer within {timeout_s:.0f} s"
            self._ask = "close"
            raise KubeError(f"the guard in {self.container} of pod/{self.pod}: {why}")

    def stand_down(self, timeout_s: float = 10.0) -> bool:
        """The watch put the levels back itself: the guard removes its record and ends. Whether it said so."""
        self._ask = "d"
        self.ended.wait(timeout_s)
        return self.said == "stood down"

    def release(self, timeout_s: float = 15.0) -> str | None:
        """Let the guard put the levels back now (its stdin ends) -> what it said then (``restored (...)``), None
        when its answer could not be heard (no half-close before the v5 exec protocol: the stream is dropped,
        and the guard restores all the same)."""
        self._ask = "eof"
        self.ended.wait(timeout_s)
        return self.said if self.said and self.said.startswith(("restored", "not restored")) else None

    @property
    def asked(self) -> bool:
        """Whether its end was asked for (stand down, release, abandon): an end not asked for is the guard's own."""
        return self._ask is not None

    def abandon(self) -> None:
        """Like ``release``, without waiting: for a run torn down in a hurry."""
        self._ask = "eof"

    def _run(self) -> None:
        ws = None
        out = ""
        try:
            ws = k8s_stream(self.kube.streaming_core().connect_get_namespaced_pod_exec, self.pod, self.namespace,
                            container=self.container, command=self.command, stdin=True, stdout=True, stderr=True,
                            tty=False, _preload_content=False)
            beat = time.monotonic() + HEARTBEAT_S
            stdin_open = True
            while ws.is_open():
                ws.update(timeout=0.2)
                out += ws.read_stdout(timeout=0) or ""
                *lines, out = out.split("\n")
                for line in lines:
                    self._heard(line.strip())
                ask = self._ask
                if ask == "close":
                    break
                if stdin_open and ask == "d":
                    ws.write_stdin(b"d")
                    stdin_open = False
                elif stdin_open and ask == "eof":
                    stdin_open = False
                    if ws.subprotocol != ws_client.V5_CHANNEL_PROTOCOL:
                        break  # no half-close: closing the stream ends the guard's stdin
                    ws.close_channel(ws_client.STDIN_CHANNEL)
                elif stdin_open and self.armed.is_set() and time.monotonic() >= beat:
                    ws.write_stdin(b"h")
                    beat = time.monotonic() + HEARTBEAT_S
            if out.strip():
                self._heard(out.strip())
        except Exception as e:  # reported by the owner, never lost silently
            self.error = api_error_message(e)
        finally:
            if ws is not None:
                try:
                    ws.close()
                except Exception:
                    pass
            self.ended.set()

    def _heard(self, line: str) -> None:
        if not line:
            return
        self.said = line
        if line == "armed":
            self.armed.set()
