"""The guard's shell script (kube/envoy_guard.py) run against a real Envoy on loopback (tests/local_envoy.py), as
the debug container runs it against the sidecar: no cluster, no root; with this host's dash, coreutils and curl,
and with BusyBox's ash and applets alone (wget, no curl), as an Alpine-based image such as netshoot has them. Its
record, its heartbeat, its stand-down, its restore on the end of its stdin and on silence, and what it leaves
alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.logging import parse_logging
from kubectl_meshdoctor.kube.envoy_guard import CHECK_SCRIPT, GUARD_SCRIPT, MARK, parse_record
from kubectl_meshdoctor.core.envoy_debug_report import EnvoyDebugReport, LeftBehind, LoggerRaise

from ..local_envoy import free_port, local_envoy
from ..waiting import wait_until

RAISED = ("connection", "pool", "router")


APPLETS = ("sh", "dd", "timeout", "date", "grep", "sed", "cat", "mv", "rm", "sleep", "printf", "tr", "wget")


@pytest.fixture
def envoy(tmp_path):
    with local_envoy(tmp_path / "envoy", free_port()) as e:
        yield e


@pytest.fixture(params=["host", "busybox"])
def tools_env(request, tmp_path) -> dict | None:
    """The tools the script runs with: this host's (dash, coreutils, curl), or BusyBox's applets alone (ash,
    its dd, timeout and wget; no curl), as in an Alpine-based image such as nicolaka/netshoot."""
    if request.param == "host":
        return None
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox here (apt-get install busybox) to try the script with its applets")
    bin_dir = tmp_path / "busybox-bin"
    bin_dir.mkdir()
    for applet in APPLETS:
        os.symlink(busybox, bin_dir / applet)
    return {"PATH": str(bin_dir)}


def levels(envoy) -> dict[str, str]:
    status, body = envoy.admin("/logging", "POST")
    assert status == 200
    return parse_logging(body)


def set_level(envoy, name: str, level: str) -> None:
    assert envoy.admin(f"/logging?{name}={level}", "POST")[0] == 200


def guard(envoy, record: Path, bound: int = 60, quiet: int = 20, env: dict | None = None) -> subprocess.Popen:
    """The guard as the debug container runs it, its stdin a pipe (the exec stream), armed."""
    sh = os.path.join(env["PATH"], "sh") if env else "sh"
    proc = subprocess.Popen([sh, "-c", GUARD_SCRIPT, MARK, str(record), str(envoy.admin_port), str(bound), str(quiet),
                             "debug", *(f"{n}=warning" for n in RAISED)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "armed", proc.stderr.read()
    return proc


def check(record: Path, env: dict | None = None):
    sh = os.path.join(env["PATH"], "sh") if env else "sh"
    out = subprocess.run([sh, "-c", CHECK_SCRIPT, "meshdoctor-check", str(record)], capture_output=True,
                         text=True, check=True, env=env).stdout
    return parse_record(str(record), out)


def raise_all(envoy) -> None:
    for n in RAISED:
        set_level(envoy, n, "debug")


def test_the_end_of_its_stdin_puts_back_only_what_is_still_raised(envoy, tmp_path, tools_env):
    record = tmp_path / "rec"
    proc = guard(envoy, record, env=tools_env)
    held = check(record, tools_env)
    assert held.alive and held.guard == proc.pid and held.level == "debug"
    assert held.restore == tuple((n, "warning") for n in RAISED)
    raise_all(envoy)
    set_level(envoy, "router", "trace")  # someone else's choice during the run: left as it is
    proc.stdin.write("h")
    proc.stdin.flush()
    proc.stdin.close()  # the watch died: its stream ended
    said = proc.stdout.read().strip()
    assert proc.wait(timeout=20) == 0, proc.stderr.read()
    assert said == "restored (the watch's stream ended)"
    now = levels(envoy)
    assert (now["connection"], now["pool"], now["router"]) == ("warning", "warning", "trace")
    assert not record.exists() and check(record, tools_env) is None


def test_stand_down_leaves_the_levels_to_the_watch(envoy, tmp_path, tools_env):
    record = tmp_path / "rec"
    proc = guard(envoy, record, env=tools_env)
    raise_all(envoy)
    proc.stdin.write("hhd")
    proc.stdin.flush()
    assert proc.stdout.read().strip() == "stood down" and proc.wait(timeout=20) == 0
    assert not record.exists()
    assert all(levels(envoy)[n] == "debug" for n in RAISED)  # the watch says it put them back itself


def test_silence_and_the_bound_each_put_them_back(envoy, tmp_path, tools_env):
    for bound, quiet, why in ((60, 2, "no heartbeat for 2 s"), (2, 60, "its bound")):
        record = tmp_path / f"rec-{bound}"
        proc = guard(envoy, record, bound=bound, quiet=quiet, env=tools_env)
        raise_all(envoy)
        started = time.monotonic()
        said = proc.stdout.readline().strip()  # stdin stays open and silent
        assert said == f"restored ({why})" and time.monotonic() - started >= 1
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0
        assert all(levels(envoy)[n] == "warning" for n in RAISED) and not record.exists()


def test_sigterm_puts_them_back(envoy, tmp_path, tools_env):
    record = tmp_path / "rec"
    proc = guard(envoy, record, quiet=2, env=tools_env)
    raise_all(envoy)
    proc.terminate()
    assert proc.stdout.read().strip() == "restored (signalled)" and proc.wait(timeout=20) == 0
    assert all(levels(envoy)[n] == "warning" for n in RAISED)


def test_a_live_guard_is_not_doubled_and_a_dead_ones_record_stays_for_the_next_run(envoy, tmp_path):
    record = tmp_path / "rec"
    first = guard(envoy, record)
    second = subprocess.run(["sh", "-c", GUARD_SCRIPT, MARK, str(record), str(envoy.admin_port), "60", "20", "debug",
                             "pool=warning"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert second.returncode == 4 and second.stdout.strip() == f"busy {first.pid}"
    first.kill()  # lost with its watch: nobody put anything back
    first.wait(timeout=10)
    left = wait_until("the guard gone", 10, lambda: (lambda r: r if not r.alive else None)(check(record)))
    assert left.guard == first.pid and record.exists()


def tools(tmp_path: Path, *extra: str) -> Path:
    """A PATH of the tools the script needs, ``extra`` (curl, wget) only as given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "dd", "timeout", "date", "grep", "sed", "cat", "mv", "rm", "sleep", "printf", *extra):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), bin_dir / tool)
    return bin_dir


@pytest.mark.skipif(not shutil.which("wget"), reason="no wget here to try the script's other client with")
def test_with_wget_and_no_curl(envoy, tmp_path):
    record = tmp_path / "rec"
    proc = guard(envoy, record, env={"PATH": str(tools(tmp_path, "wget"))})
    raise_all(envoy)
    proc.stdin.close()
    assert proc.stdout.read().strip() == "restored (the watch's stream ended)" and proc.wait(timeout=20) == 0
    assert all(levels(envoy)[n] == "warning" for n in RAISED) and not record.exists()


def test_no_curl_nor_wget_is_refused_before_anything_is_recorded(envoy, tmp_path):
    bin_dir = tools(tmp_path)
    proc = subprocess.run([str(bin_dir / "sh"), "-c", GUARD_SCRIPT, MARK, str(tmp_path / "rec"),
                           str(envoy.admin_port), "60", "20", "debug", "pool=warning"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                          env={"PATH": str(bin_dir)})
    assert proc.returncode == 3 and "neither curl nor wget" in proc.stdout
    assert not (tmp_path / "rec").exists()


def test_the_report_line_says_what_from_what_to_what_for_how_long_and_who_put_it_back():
    r = EnvoyDebugReport("web", True, ("connection", "pool", "nope"),
                         (LoggerRaise("connection", "warning", "debug", "warning"),
                          LoggerRaise("pool", "info", "debug", "info")),
                         missing=("nope",), raised_at=100.0, restored_at=112.5, seconds=12.5, restored=True,
                         restored_by="watch")
    assert r.line() == ("envoy debug pod/web: connection, pool info/warning -> debug for 12.5 s, put back by the "
                        "watch; not in this proxy: nope")
    d = r.to_dict()
    assert d["raised"][1] == {"logger": "pool", "from": "info", "to": "debug", "after": "info"}
    assert d["missing"] == ["nope"] and d["restored_by"] == "watch" and "left_behind" not in d
    failed = EnvoyDebugReport("web", True, ("pool",), error="Envoy admin not reachable: forbidden")
    assert failed.line() == "envoy debug pod/web: not raised: Envoy admin not reachable: forbidden"
    found = EnvoyDebugReport("web", False, ("pool",), left_behind=LeftBehind(90.0, {"pool": "warning"}, True))
    assert found.line() == "envoy debug pod/web: an earlier run's raise of pool was put back at the start"
