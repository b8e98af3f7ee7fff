"""The command line contract: exit codes and one-line errors (DESIGN.md), run as a user runs it."""

import subprocess
import sys

import pytest


def meshdoctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def assert_one_line_error(proc, needle):
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_analyze_missing_file(tmp_path):
    assert_one_line_error(meshdoctor("analyze", str(tmp_path / "nope.pcap")), "no such file")


def test_analyze_not_a_capture(tmp_path):
    f = tmp_path / "notes.pcap"
    f.write_text("GET / HTTP/1.1\r\n\r\n")
    assert_one_line_error(meshdoctor("analyze", str(f)), "not a pcap or pcapng capture")


@pytest.mark.parametrize("jobs", ["0", "-1", "1_0", "abc", "1.5"])
def test_analyze_jobs_must_be_a_whole_number_of_at_least_one(jobs, tmp_path):
    proc = meshdoctor("analyze", f"--jobs={jobs}", str(tmp_path / "x.pcap"))
    assert_one_line_error(proc, "--jobs")


def test_analyze_directory(tmp_path):
    assert_one_line_error(meshdoctor("analyze", str(tmp_path)), "is a directory")


def test_analyze_a_pipe_is_refused_not_read_empty():
    """Reading the magic from a pipe would steal it from tshark, which then silently finds nothing."""
    from pathlib import Path

    capture = (Path(__file__).parent / "data" / "lab-collision-eth0.pcap").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", "/dev/stdin"], input=capture,
                          capture_output=True, timeout=120)
    assert proc.returncode == 2 and b"not a regular file" in proc.stderr and proc.stderr.count(b"\n") == 1


def test_no_command_prints_help_and_exits_2():
    proc = meshdoctor()
    assert proc.returncode == 2 and "watch" in proc.stdout and "analyze" in proc.stdout


@pytest.mark.parametrize("target", ["svc/x", "pod/", "statefulset/db"])
def test_watch_bad_target(target, tmp_path):
    assert_one_line_error(meshdoctor("watch", target, "--kubeconfig", str(tmp_path / "kc")), "use pod/NAME")


def test_watch_missing_kubeconfig(tmp_path):
    assert_one_line_error(meshdoctor("watch", "pod/x", "--kubeconfig", str(tmp_path / "kc")), "does not exist")


def test_watch_bad_duration():
    assert_one_line_error(meshdoctor("watch", "pod/x", "--duration", "-3"), "must be more than 0")


def test_help_teaches_with_examples():
    proc = meshdoctor("watch", "--help")
    assert proc.returncode == 0
    for flag in ("--namespace", "--context", "--kubeconfig", "--no-tui", "--duration", "examples:"):
        assert flag in proc.stdout


KUBECONFIG_DOWN = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize("content, needle", [
    ("hello\n", "not a kubeconfig"),
    ("a: [b\n", "not valid YAML at line 2"),
    ("- 1\n- 2\n", "not a kubeconfig"),
    (KUBECONFIG_DOWN, "cannot reach the API server at http://127.0.0.1:1: connection refused"),
])
def test_watch_bad_kubeconfigs_are_one_line(tmp_path, content, needle):
    kc = tmp_path / "kc"
    kc.write_text(content)
    assert_one_line_error(meshdoctor("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui"), needle)


def test_kubeconfig_list_skips_empty_files_like_kubectl(tmp_path):
    import os

    empty, down = tmp_path / "empty", tmp_path / "down"
    empty.write_text("")
    down.write_text(KUBECONFIG_DOWN)
    env = dict(os.environ, KUBECONFIG=f"{empty}:{tmp_path / 'missing'}:{down}")
    assert_one_line_error(meshdoctor("watch", "pod/x", "--no-tui", env=env), "cannot reach the API server")


@pytest.mark.parametrize("name", ["bad name/x", "UPPER", "-dash", "a" * 64])
def test_lab_names_must_be_namespace_names(name):
    assert_one_line_error(meshdoctor("lab", "up", f"--name={name}"), "must be a Kubernetes namespace name")


def test_the_same_file_twice_counts_once():
    from pathlib import Path

    f = str(Path(__file__).parent / "data" / "lab-collision-eth0.pcap")
    once, twice = meshdoctor("analyze", f, "-o", "json"), meshdoctor("analyze", f, f, "-o", "json")
    assert once.stdout == twice.stdout and once.returncode == twice.returncode == 1
