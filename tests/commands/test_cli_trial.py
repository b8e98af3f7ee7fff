"""What a new user met at an 80x24 terminal (issue s46): the headless watch's lines, flags before the command,
durations, help that copied the code's lists, and `analyze -`."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest

from kubectl_meshdoctor.commands import watch as watch_command
from kubectl_meshdoctor.commands.watch.headless_stop import found_so_far
from kubectl_meshdoctor.commands.watch.live import WatchOptions

from ..waiting import wait_until_async


class _Terminal(io.StringIO):
    """stdout and stderr of one terminal: what both write lands on one screen, in order."""

    def isatty(self) -> bool:
        return True


def _headless(monkeypatch, duration_s: float | None) -> str:
    """A headless watch (commands/watch._watch_headless) on a terminal; the capture stands in for the cluster and
    returns once the progress line has been drawn. What the terminal shows."""
    screen = _Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setattr(sys, "stdout", screen)

    async def capture(kube, opts, make_pipeline, stop, progress, state):
        pipeline = make_pipeline("refused")
        state.phase = "capturing"  # past the API server and the debug container: the line counts packets
        await wait_until_async("the progress line", 10, screen.getvalue, ok=lambda text: "so far" in text)
        return found_so_far([pipeline], ["refused"], opts.namespace)

    monkeypatch.setattr(watch_command, "watch", capture)
    opts = WatchOptions(targets=(), namespace="default", duration_s=duration_s)
    watch_command._watch_headless(SimpleNamespace(), opts, "text")
    return screen.getvalue()


def test_the_report_starts_on_a_line_of_its_own_after_the_progress_line(monkeypatch):
    shown = _headless(monkeypatch, duration_s=15.0)
    first = min(shown.index(word) for word in ("problem: ", "kubectl-meshdoctor "))
    before = shown[:first]
    assert before.endswith("\n") or before.endswith("\r\033[K"), repr(before[-120:])


def test_a_headless_watch_without_duration_says_once_how_it_ends(monkeypatch):
    shown = _headless(monkeypatch, duration_s=None)
    assert shown.count("Ctrl-C ends the capture and prints the report") == 1


def test_a_headless_watch_with_a_duration_needs_no_ctrl_c(monkeypatch):
    assert "Ctrl-C" not in _headless(monkeypatch, duration_s=15.0)


def _meshdoctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("flag", ["--duration", "--ttl", "--start-timeout"])
@pytest.mark.parametrize("text, seconds", [("15", 15.0), ("1.5", 1.5), ("2m", 120.0), ("90s", 90.0),
                                           ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0)])
def test_spans_of_time_take_seconds_or_kubectl_durations(flag, text, seconds):
    from kubectl_meshdoctor.cli import build_parser

    args = build_parser().parse_args(["watch", "pod/x", flag, text])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == seconds


@pytest.mark.parametrize("text, needle", [("2x", "not a number of seconds or a duration such as 90s, 2m"),
                                          ("inf", "not a number of seconds or a duration"),
                                          ("-3", "must be more than 0 seconds"), ("0s", "must be more than 0"),
                                          ("9999h", "at most 365 days")])
def test_a_bad_duration_is_one_usage_line(text, needle):
    proc = _meshdoctor("watch", "pod/x", f"--duration={text}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"argument --duration: {needle}" in lines[0], proc.stderr


def test_watch_help_says_the_duration_forms():
    text = " ".join(_meshdoctor("watch", "--help").stdout.split())
    assert "--duration DURATION stop after this long: seconds or 90s, 2m, 1h" in text


def test_watch_help_lists_the_loggers_envoy_debug_raises():
    from kubectl_meshdoctor.core.pipeline import Pipeline
    from kubectl_meshdoctor.envoy.story import STORY_LOGGERS

    text = " ".join(_meshdoctor("watch", "--help").stdout.split())
    listed = text.split("raise the sidecar's Envoy loggers the detectors read (", 1)[1].split(")", 1)[0]
    assert set(listed.split(", ")) == set(Pipeline.with_detectors().envoy_loggers()) >= set(STORY_LOGGERS)


def test_help_and_readme_give_the_same_exit_codes():
    from pathlib import Path

    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().replace("`", "").split())
    shown = " ".join(_meshdoctor("--help").stdout.split())
    for case in ("0 no error finding, 1 at least one error finding, 2 usage or input error (one line on stderr), "
                 "or a run that read nothing and found no error",
                 "a watch where no interface captured anything or every capture stream was lost",
                 "an analyze where no input held anything to read (a pcap header alone, frames of no byte, a log "
                 "with no line of Envoy's)"):
        assert case in shown and case in readme, case


@pytest.mark.parametrize("argv, said", [
    ("-n ns watch pod/x", "-n/--namespace goes after the command: kubectl meshdoctor watch -n ns pod/x"),
    ("--namespace=ns watch pod/x",
     "-n/--namespace goes after the command: kubectl meshdoctor watch --namespace=ns pod/x"),
    ("--context prod -n shop watch deploy/r --no-tui",
     "--context goes after the command: kubectl meshdoctor watch --context prod -n shop deploy/r --no-tui"),
    ("--kubeconfig /tmp/k lint pod/y",
     "--kubeconfig goes after the command: kubectl meshdoctor lint --kubeconfig /tmp/k pod/y"),
    ("-nshop analyze a.pcap", "-n/--namespace: analyze has no such option (see kubectl meshdoctor analyze --help)"),
])
def test_a_cluster_flag_before_the_command_is_one_line_saying_where_it_goes(argv, said):
    proc = _meshdoctor(*argv.split())
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"kubectl meshdoctor: error: {said}\n"


def test_one_access_log_line_read_is_one_line(tmp_path):
    from pathlib import Path

    data = Path(__file__).parents[1] / "envoy" / "data" / "istio_access_log.txt"
    line = next(x for x in data.read_text().splitlines() if x.startswith("["))
    log = tmp_path / "proxy.log"
    log.write_text(line + "\n")
    first = _meshdoctor("analyze", str(log)).stdout.splitlines()[0]
    assert first.endswith("no capture; 1 access-log line read"), first
    log.write_text(f"{line}\n{line}\n")
    assert _meshdoctor("analyze", str(log)).stdout.splitlines()[0].endswith("; 2 access-log lines read")


@pytest.mark.parametrize("n, said", [(1, "the run's"), (2, "the run's, for both problems that name it"),
                                     (4, "the run's, for all 4 problems that name it")])
def test_a_counter_two_problems_name_is_said_to_be_both_of_theirs(n, said):
    from collections import Counter

    from kubectl_meshdoctor.frontends.report import _whose

    counter = "cluster.x.upstream_rq_503"
    assert _whose("reviews", counter, Counter({("reviews", counter): n})) == said


@pytest.mark.parametrize("argv", [["-"], ["-", "ticket.txt"]])
def test_analyze_dash_says_to_save_stdin_to_a_file(argv, tmp_path):
    (tmp_path / "ticket.txt").write_text("[2025-06-12T08:14:03.512Z] \"GET / HTTP/1.1\" 503 UF\n")
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *argv], input="x\n",
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("kubectl meshdoctor: error: -: analyze reads files, not standard input: save it to a "
                           "file first and name the file (analyze ticket.txt)\n")
