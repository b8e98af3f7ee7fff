"""`analyze` reads access logs however they reach the user: in any default format Istio or Envoy shipped, in the
mesh's own (--log-format), and wrapped by kubectl, stern, a node's log files or grep (docs/access-log-formats.md).
A wrapped or old-format log is told apart from other files by its content as a plain one is."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from kubectl_meshdoctor.envoy.istio_formats import ENVOY_DEFAULT, TEXT_FORMATS
from kubectl_meshdoctor.envoy.log_format import compile_format
from kubectl_meshdoctor.sources.envoy_files import read_access_log
from kubectl_meshdoctor.sources.files import ENVOY_LOG, InputError, input_kind

from ..envoy.render import render_text
from ..envoy.test_wrappers import cri, docker_json, grep_hn, kubectl_prefix, kubectl_timestamps, stern
from ..plugins.test_access_log_classes import CLASSES, text

UT = text(CLASSES["upstream-timeout"][0])  # Istio's newest TEXT format: 504 UT response_timeout
CUSTOM = "%START_TIME(%s.%3f)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %DURATION% %UPSTREAM_HOST%"
ENTRY = {"ts": 1796305208.25, "method": "GET", "path": "/slow/3", "protocol": "HTTP/1.1", "code": 504,
         "flags": ("UT",), "details": "response_timeout", "duration_ms": 1001, "bytes_sent": 24,
         "upstream_host": "198.18.5.2:5000", "upstream_cluster": "inbound|5000||",
         "downstream_remote": "198.18.5.1:40110", "downstream_local": "198.18.5.2:5000"}


def analyze(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *args, "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout else {}), proc.stderr


def read(path, log_format=None):
    events = []

    async def gate() -> None:
        return None

    result = asyncio.run(read_access_log(str(path), events.append, gate, log_format))
    return result, events


@pytest.mark.parametrize("shape", ["kubectl-prefix", "stern", "cri", "docker", "grep", "istio-1.1", "istio-1.8",
                                   "envoy-default"])
def test_wrapped_and_old_format_logs_are_access_logs(tmp_path, shape):
    old = {f.name: render_text(f.format, ENTRY) for f in TEXT_FORMATS}
    body = {"kubectl-prefix": kubectl_prefix(kubectl_timestamps(UT)), "stern": stern(UT, colour=True),
            "cri": cri(UT), "docker": docker_json(UT), "grep": grep_hn(UT), "istio-1.1": old["istio-1.1"],
            "istio-1.8": old["istio-1.8"], "envoy-default": render_text(ENVOY_DEFAULT.format, ENTRY)}[shape]
    log = tmp_path / "proxy.log"
    log.write_text(body + "\n")
    assert input_kind(str(log)) == ENVOY_LOG
    result, (event,) = read(log)
    assert (event.entry.code, event.entry.flags, event.line) == (504, ("UT",), 1)
    assert event.entry.pod == ("reviews-v1-7d9f8" if shape in ("kubectl-prefix", "stern") else None)
    assert result.problems == []


@pytest.mark.parametrize("wrap", [lambda s: kubectl_prefix(kubectl_timestamps(s)), stern, cri, grep_hn])
def test_a_wrapped_proxy_log_without_access_log_lines_is_still_one(tmp_path, wrap):
    log = tmp_path / "proxy.log"
    log.write_text(wrap("2026-12-01T09:59:58.101882Z\tinfo\tEnvoy proxy is ready") + "\n")
    assert input_kind(str(log)) == ENVOY_LOG


def test_a_log_of_the_meshs_own_format_needs_it(tmp_path):
    log = tmp_path / "proxy.log"
    log.write_text(render_text(CUSTOM, ENTRY) + "\n")
    with pytest.raises(InputError):
        input_kind(str(log))
    fmt = compile_format(CUSTOM)
    assert input_kind(str(log), fmt) == ENVOY_LOG
    _, (event,) = read(log, fmt)
    assert (event.entry.code, event.entry.details, event.entry.upstream_host) == (504, "response_timeout",
                                                                                  "198.18.5.2:5000")
    assert event.ts == pytest.approx(ENTRY["ts"] + 1.001)  # placed at its request's end


def test_the_pieces_of_a_split_line_are_read_as_one(tmp_path):
    log = tmp_path / "0.log"
    pieces = [cri(UT[:100], "P"), cri(UT[100:200], "P"), cri(UT[200:]),
              cri("2026-12-01T10:00:04.000000Z\tinfo\tenvoy main\tstarted"),
              json.dumps({"log": UT[:50], "stream": "stdout", "time": "2026-12-01T10:00:05Z"}),
              docker_json(UT[50:])]
    log.write_text("\n".join(pieces) + "\n")
    result, events = read(log)
    assert [(e.line, e.entry.raw) for e in events] == [(1, UT), (5, UT)]
    assert result.problems == []


def test_a_log_that_ends_inside_a_split_line_says_so(tmp_path):
    log = tmp_path / "0.log"
    log.write_text(cri(UT) + "\n" + cri(UT[:60], "P") + "\n")
    result, events = read(log)
    assert len(events) == 1 and result.problems == [
        "the log ends in the middle of a line split by the container runtime (from line 2); that line was not read"]


def test_lines_read_in_part_are_counted_and_the_flag_is_named(tmp_path):
    log = tmp_path / "proxy.log"
    log.write_text(UT + "\n" + UT[:UT.index("inbound|5000||") + 14] + "\n")
    result, events = read(log)
    assert [e.entry.code for e in events] == [504, 504] and result.partial == 1 and result.first_partial == 2
    (problem,) = result.problems
    assert "1 line(s) match no known access-log format whole" in problem and "--log-format" in problem


def test_analyze_log_format(tmp_path):
    log = tmp_path / "proxy.log"
    log.write_text(kubectl_timestamps(render_text(CUSTOM, ENTRY)) + "\n")
    code, report, err = analyze(str(log), "--log-format", CUSTOM)
    assert code == 1, err
    (finding,) = report["findings"]
    assert finding["detector"] == "upstream-timeout" and report["envoy"]["access_log_lines"] == 1
    code, _, err = analyze(str(log))
    assert code == 2 and "not a capture" in err


@pytest.mark.parametrize("fmt, says", [
    ("%START_TIME% %RESPONSE_CODE", "no command operator at position 13"),
    ("%START_TIME% %DURATION%", "neither %RESPONSE_CODE% nor %RESPONSE_FLAGS%"),
    ('{"code": "%RESPONSE_CODE%"', "not a JSON object"),
])
def test_a_bad_log_format_is_one_line_and_exit_2(tmp_path, fmt, says):
    log = tmp_path / "proxy.log"
    log.write_text(UT + "\n")
    code, report, err = analyze(str(log), "--log-format", fmt)
    assert code == 2 and report == {} and err.count("\n") == 1
    assert err.startswith("kubectl meshdoctor: error: --log-format: ") and says in err
