"""`lint -f FILE`: Pods from a saved manifest or `kubectl get -o yaml|json` output, no cluster needed; anything
else is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DATA = Path(__file__).parent / "data"


def lint(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lint", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_a_saved_pod_is_linted_as_the_cluster_one_would_be(tmp_path):
    proc = lint("-f", str(DATA / "classic.yaml"), "-o", "json")
    assert proc.returncode == 0, proc.stderr  # warnings only
    report = json.loads(proc.stdout)
    saved = yaml.safe_load((DATA / "classic.yaml").read_text())["metadata"]
    assert report["source"]["pods"] == [f"{saved['namespace']}/{saved['name']}"]
    assert {f["detector"] for f in report["findings"]} == {"redirect-exposure", "hold-application"}


def test_a_list_and_several_documents_from_stdin_are_every_pod_in_them():
    classic, native = (yaml.safe_load((DATA / f"{n}.yaml").read_text()) for n in ("classic", "native"))
    as_list = json.dumps({"apiVersion": "v1", "kind": "List", "items": [classic, native]})
    proc = lint("-f", "-", "-o", "json", stdin=as_list)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["source"]["pods"]) == 2
    docs = yaml.safe_dump_all([classic, native])
    assert json.loads(lint("-f", "-", "-o", "json", stdin=docs).stdout)["source"]["pods"] == \
        json.loads(proc.stdout)["source"]["pods"]


def test_an_error_finding_in_the_file_exits_1():
    proc = lint("-f", str(DATA / "no-sidecar.yaml"))
    assert proc.returncode == 1 and "no-sidecar" in proc.stdout, proc.stderr


@pytest.mark.parametrize(("text", "says"), [
    ("a: [", "stdin is not YAML or JSON at line 1"),
    ("kind: Deployment\n", "lint reads Pods, not Deployment"),
    ("", "stdin holds no Pod"),
    ("- 1\n", "lint reads Pods, not list"),
])
def test_what_is_not_a_pod_is_one_line_and_exit_2(text, says):
    proc = lint("-f", "-", stdin=text)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_a_missing_file_or_a_second_target_is_one_line_and_exit_2(tmp_path):
    proc = lint("-f", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr and proc.stderr.count("\n") == 1
    proc = lint("-f", str(DATA / "classic.yaml"), "pod/x")
    assert proc.returncode == 2 and "name one target" in proc.stderr
