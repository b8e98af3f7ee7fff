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
    ("a: [", "stdin is not YAML or JSON at line"),
    ("kind: Deployment\n", "lint reads Pods, not Deployment"),
    ("", "stdin holds no Pod"),
    ("- 1\n", "lint reads Pods, not a list"),
    ("[1, 2]", "lint reads Pods, not a list"),
    # What the API server refuses, named by its field instead of failing deep in a rule:
    ("kind: Pod\nmetadata:\n  name: p\n  annotations:\n    proxy.istio.io/config: {holdApplicationUntilProxyStarts: "
     "true}\n", 'pod p: metadata.annotations["proxy.istio.io/config"] must be a string'),
    ("kind: Pod\nmetadata: 5\n", "pod ?: metadata must be a mapping"),
    ("kind: List\nitems: 5\n", "document 1: items must be a list"),
    ("kind: Pod\nmetadata: {annotations: [a]}\n", "metadata.annotations must be a mapping"),
    ("kind: Pod\nspec: {containers: 3}\n", "spec.containers must be a list of mappings"),
    ("kind: Pod\nspec: {containers: [{name: a, ports: x}]}\n", "spec.containers[0].ports must be a list"),
    ("kind: Pod\nstatus: {containerStatuses: [{name: a, restartCount: '7'}]}\n",
     "status.containerStatuses[0].restartCount must be a number"),
    ("kind: Pod\nstatus: up\n", "status must be a mapping"),
    # What a fuzzing review found ending in an internal error (RecursionError, MemoryError, ...):
    ('{"kind":"Pod","spec":{"containers":' + "[" * 1500 + "]" * 1500 + "}}", "nests too deeply"),
    ("a: &a [x]\nb: [" + ",".join(["*a"] * 2000) + "]\nkind: Pod\n", "uses 2000 YAML aliases"),
    ("kind: Pod\nspec: {containers: [{name: a, ports: [{containerPort: " + "9" * 5000 + "}]}]}\n",
     "holds a value no Pod can have"),
    ("kind: Pod\nspec: {containers: [{name: a, ports: [{containerPort: 70000}]}]}\n", "between 1 and 65535"),
    ("kind: Pod\nstatus: {containerStatuses: [{name: app, restartCount: 9, lastState: x}]}\n",
     "status.containerStatuses[0].lastState must be a mapping"),
    ("kind: Pod\nspec: {containers: [{name: a, args: 5}]}\n", "spec.containers[0].args must be a list of strings"),
])
def test_what_is_not_a_pod_is_one_line_and_exit_2(text, says):
    proc = lint("-f", "-", stdin=text)
    assert proc.returncode == 2 and proc.stdout == "" and "internal error" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_concatenated_json_objects_are_read_as_kubectl_reads_them():
    classic = (DATA / "classic.yaml").read_text()
    one = json.dumps(yaml.safe_load(classic))
    proc = lint("-f", "-", "-o", "json", stdin=one + "\n" + one)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["source"]["pods"]) == 2


def test_a_binary_file_is_said_to_be_no_manifest(tmp_path):
    path = tmp_path / "capture.pcap"
    path.write_bytes(b"\xd4\xc3\xb2\xa1\x02\x00\x04\x00\xff\xfe")
    proc = lint("-f", str(path))
    assert proc.returncode == 2 and "is not text (UTF-8)" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_missing_file_or_a_second_target_is_one_line_and_exit_2(tmp_path):
    proc = lint("-f", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr and proc.stderr.count("\n") == 1
    proc = lint("-f", str(DATA / "classic.yaml"), "pod/x")
    assert proc.returncode == 2 and "name one target" in proc.stderr
