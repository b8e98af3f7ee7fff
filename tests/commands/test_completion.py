"""kubectl's plugin completion: the installed `kubectl_complete-meshdoctor` run with the words kubectl passes it
(the words after `meshdoctor`, the last one being completed), and the real kubectl running it (>= 1.26)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..lab.kubectl_lab import kubectl as lab_kubectl  # noqa: F401 (a fixture, used by name)

BIN = Path(sys.executable).parent
COMPLETE = BIN / "kubectl_complete-meshdoctor"
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No kubeconfig of the user's, so nothing here talks to a real cluster."""
    return {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "no-kubeconfig")}


def complete(env: dict[str, str], *words: str) -> tuple[list[str], int]:
    """The completion values (descriptions dropped) and the cobra directive."""
    if not COMPLETE.exists():
        pytest.fail(f"{COMPLETE} is missing: reinstall the package (scripts/install) for its console scripts")
    proc = subprocess.run([str(COMPLETE), *words], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc
    assert proc.stderr == "", proc.stderr  # kubectl shows our stderr in the middle of the user's prompt
    lines = proc.stdout.splitlines()
    assert lines and re.fullmatch(r":\d+", lines[-1]), proc.stdout
    return [line.split("\t", 1)[0] for line in lines[:-1]], int(lines[-1][1:])


def test_subcommands_come_from_the_parser(env):
    values, directive = complete(env, "")
    assert values == ["watch", "log-level", "lint", "analyze", "lab"]
    assert directive == 4  # NoFileComp: no file names where a subcommand goes
    assert complete(env) == (values, 4)  # no word at all is a new word too
    assert complete(env, "l") == (["log-level", "lint", "lab"], 4)


def test_descriptions_are_the_help_one_line_each(env):
    proc = subprocess.run([str(COMPLETE), "w"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.stdout.splitlines() == [
        "watch\tcapture a pod live and show findings (TUI, or a report with --no-tui)", ":4"]


def test_flags_of_the_subcommand(env):
    values, directive = complete(env, "watch", "--n")
    assert set(values) == {"--namespace", "--no-tui", "--no-redact"} and directive == 4
    values, _ = complete(env, "watch", "-")
    assert {"-n", "--context", "--kubeconfig", "--duration", "--dry-run", "--help"} <= set(values)
    assert len(values) == len(set(values))
    assert "--jobs" not in values  # analyze's
    assert "--jobs" in complete(env, "analyze", "a.pcap", "--j")[0]
    assert complete(env, "--v") == (["--version"], 4)


def test_targets_are_pod_and_deploy_prefixes_without_a_space(env):
    assert complete(env, "watch", "") == (["pod/", "deploy/"], 2 | 4)  # NoSpace: the name follows the slash
    assert complete(env, "lint", "d") == (["deploy/"], 6)
    # Flags and their values before the target are skipped, abbreviated ones too, as argparse does.
    assert complete(env, "watch", "--kube", "kc", "-n", "shop", "--no-tui", "p") == (["pod/"], 6)
    assert complete(env, "log-level", "--namespace=shop", "") == (["pod/", "deploy/"], 6)
    # lint takes one target: after it, nothing more (and no file names); watch takes several (both hops).
    assert complete(env, "lint", "pod/x", "") == ([], 4)
    assert complete(env, "watch", "pod/x", "") == (["pod/", "deploy/"], 6)


def test_flag_values(env):
    assert complete(env, "watch", "-o", "") == (["json", "markdown", "text"], 4)
    assert complete(env, "watch", "--output=m") == (["--output=markdown"], 4)
    assert complete(env, "lab", "up", "--access-log", "") == (["text", "json"], 4)
    assert complete(env, "watch", "--duration", "") == ([], 4)  # a number: no file names
    assert complete(env, "watch", "--write-pcap", "") == ([], 16)  # FilterDirs
    assert complete(env, "lab", "down", "--state-dir", "") == ([], 16)
    assert complete(env, "watch", "--kubeconfig", "") == ([], 0)  # a file: the shell completes it


def test_nested_subcommands_and_files(env):
    assert complete(env, "lab", "") == (["up", "down", "status"], 4)
    assert "--legacy-inbound" in complete(env, "lab", "up", "--l")[0]
    assert complete(env, "analyze", "") == ([], 0)  # capture files: the shell's file completion
    assert complete(env, "analyze", "lo.pcap", "") == ([], 0)
    assert complete(env, "analyze", "--", "-odd.pcap", "") == ([], 0)


@pytest.mark.parametrize("words", [
    ["bogus", ""], ["watch", "--no-such-flag", ""], ["watch", "-o"], ["--", "--", ""], ["watch", "=", "-"],
    ["watch", "--output="], ["lab", "sideways", "--"], ["watch", "-\udcff", "\udcfe"], ["-"],
])
def test_bad_input_is_answered_quietly(env, words):
    values, directive = complete(env, *words)
    assert directive in (0, 2, 4, 6, 16)


def test_names_from_an_unreachable_cluster_are_none_and_fast(env, tmp_path):
    """The names come from the real kubectl on PATH; a cluster that refuses costs a completion, nothing more."""
    if KUBECTL is None:
        pytest.skip("no kubectl on PATH")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "one",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "one", "context": {"cluster": "c", "user": "u"}},
                     {"name": "two", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}]}))
    assert complete(env, "watch", "--kubeconfig", str(kubeconfig), "pod/") == ([], 4)
    assert complete(env, "watch", "--kubeconfig", str(kubeconfig), "-n", "") == ([], 4)
    # Contexts are read from the kubeconfig alone.
    assert complete(env, "watch", f"--kubeconfig={kubeconfig}", "--context", "") == (["one", "two"], 4)
    assert complete(env, "lint", "--kubeconfig", str(kubeconfig), "--context=t") == (["--context=two"], 4)


def _kubectl_minor() -> int | None:
    if KUBECTL is None:
        return None
    proc = subprocess.run([KUBECTL, "version", "--client", "-o", "json"], capture_output=True, text=True,
                          timeout=60)
    try:
        return int(re.sub(r"\D", "", json.loads(proc.stdout)["clientVersion"]["minor"]))
    except (ValueError, KeyError):
        return None


def test_kubectl_runs_the_completion_of_the_plugin(env):
    """kubectl >= 1.26 finds kubectl-meshdoctor and kubectl_complete-meshdoctor on PATH and relays what the
    latter prints (cobra's __complete output: one completion a line, then :directive)."""
    minor = _kubectl_minor()
    if minor is None or minor < 26:
        pytest.skip(f"needs kubectl >= 1.26 on PATH for plugin completion (have {KUBECTL}, minor {minor})")
    env = {**env, "PATH": f"{BIN}{os.pathsep}{env['PATH']}"}

    def kubectl_complete(*words: str) -> list[str]:
        proc = subprocess.run([KUBECTL, "__complete", "meshdoctor", *words], capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.returncode == 0, proc
        return proc.stdout.splitlines()

    out = kubectl_complete("w")
    assert out[0].split("\t")[0] == "watch" and out[-1] == ":4", out
    out = kubectl_complete("watch", "--kubec")
    assert [line.split("\t")[0] for line in out] == ["--kubeconfig", ":4"]
    assert kubectl_complete("watch", "") == ["pod/", "deploy/", ":6"]


@pytest.mark.lab
def test_pod_and_deploy_names_from_the_lab(lab_kubectl):
    """Against the pod lab's API server, through the real kubectl: the names of what can be watched."""
    env = lab_kubectl.env()
    assert complete(env, "watch", "pod/") == (["pod/healthy"], 4)
    assert complete(env, "watch", "--kubeconfig", str(lab_kubectl.kubeconfig), "heal") == (["healthy"], 4)
    assert complete(env, "watch", "pod/nope") == ([], 4)
    namespaces, _ = complete(env, "lint", "-n", "")
    assert lab_kubectl.state.namespace in namespaces
