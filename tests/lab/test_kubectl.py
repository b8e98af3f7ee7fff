"""The real `kubectl` against the pod lab's test API server: every verb a person uses on a lab pod.

A module lab (pod `healthy`, no drivers) is brought up with `lab.up`; each test runs the kubectl on PATH with the
lab's kubeconfig (HTTPS, the lab's CA) and asserts on what it prints. Streaming verbs run over both transports
kubectl has: WebSockets (KUBECTL_REMOTE_COMMAND_WEBSOCKETS / KUBECTL_PORT_FORWARD_WEBSOCKETS=true, kubectl >= 1.29
/ 1.30) and SPDY/3.1 (=false, and all an older kubectl such as Debian's 1.20 speaks); the API server's log says
which one served the request, and the test checks that too. Interactive sessions (`debug -it`) run kubectl on a
real pseudo-terminal. Needs root; skipped with the reason when no kubectl is on PATH.
"""

from __future__ import annotations

import calendar
import hashlib
import re
import secrets
import select
import subprocess
import time

import pytest
import yaml

from meshdoctor_lab.apiserver.kubeconfig import admin_call

from .kubectl_lab import (  # noqa: F401 (the fixtures are used by name)
    POD,
    TRANSPORTS,
    Kubectl,
    Terminal,
    _add_ephemeral,
    _log_file,
    _need_websockets,
    _no_faults,
    _transport,
    kubectl,
)

pytestmark = pytest.mark.lab


def _age_seconds(text: str) -> int:
    """kubectl's AGE (`42s`, `2m3s`, `5m`) in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def test_get_pods_shows_the_pod_with_its_real_age(kubectl: Kubectl) -> None:
    lab_started = min(t for k, t in kubectl.state.started.items() if k.startswith(f"{POD}/"))
    proc = kubectl.run("get", "pods")
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    name, ready, status, restarts, age = row.split()
    assert (name, ready, status, restarts) == (POD, "2/2", "Running", "0")
    elapsed = time.time() - lab_started
    assert elapsed - 3 <= _age_seconds(age) <= elapsed + 3, (age, elapsed)
    every = kubectl.run("get", "pods", "-A")
    assert every.stdout.split()[:6] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert every.stdout.splitlines()[1].split()[:2] == [kubectl.state.namespace, POD]


def test_get_pod_yaml_has_lab_times_and_an_honest_owner(kubectl: Kubectl) -> None:
    proc = kubectl.run("get", "pod", POD, "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    pod = yaml.safe_load(proc.stdout)
    meta = pod["metadata"]
    assert meta["name"] == POD and meta["namespace"] == kubectl.state.namespace
    lab_started = min(t for k, t in kubectl.state.started.items() if k.startswith(f"{POD}/"))
    created = calendar.timegm(time.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
    assert int(lab_started) == created
    # The pod keeps the lab's name, so no generateName would explain it; its ReplicaSet owns it (adoption).
    assert "generateName" not in meta
    owner = meta["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet" and owner["name"].startswith(f"{POD}-") and owner["controller"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "istio-proxy"]


def test_get_pods_watch_streams_table_rows(kubectl: Kubectl) -> None:
    proc = kubectl.popen("get", "pods", "-w")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split()[0] == "NAME"
        assert proc.stdout.readline().split()[:3] == [POD, "2/2", "Running"]
        # A change of the pod (an ephemeral container) is a MODIFIED event: kubectl prints the row again.
        _add_ephemeral(kubectl, "dbg-watch", ["sleep", "300"])
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no watch event within 30 s"
        assert proc.stdout.readline().split()[:3] == [POD, "2/2", "Running"]
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # The rows came from the server (a Table per event), not from printing Pod objects on the client.
    assert "watch pods: Table rows" in kubectl.server_log()


# ------------------------------------------------------------------------------------------------ logs


def test_logs_and_logs_follow(kubectl: Kubectl) -> None:
    mark = secrets.token_hex(4)
    with open(_log_file(kubectl, "istio-proxy"), "a") as f:
        f.write(f"before-{mark}\n")
    proc = kubectl.run("logs", POD, "-c", "istio-proxy")
    assert proc.returncode == 0, proc.stderr
    assert f"before-{mark}\n" in proc.stdout
    follow = kubectl.popen("logs", "-f", POD, "-c", "istio-proxy", "--tail", "1")
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == f"before-{mark}\n"
        with open(_log_file(kubectl, "istio-proxy"), "a") as f:
            f.write(f"after-{mark}\n")
        ready, _, _ = select.select([follow.stdout], [], [], 30)
        assert ready and follow.stdout.readline() == f"after-{mark}\n"
        assert follow.poll() is None  # still following
    finally:
        follow.kill()
        follow.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ exec


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_runs_in_the_pod_netns_with_exit_code(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    since = len(kubectl.server_log())
    mark = secrets.token_hex(4)
    proc = kubectl.run("exec", POD, "-c", "istio-proxy", "--", "sh", "-c",
                       f"ip -o -4 addr show eth0; id -u; echo err-{mark} >&2; exit 3", websockets=websockets)
    assert proc.returncode == 3, proc.stderr
    assert f" {kubectl.state.pod(POD).pod_ip}/24 " in proc.stdout
    assert proc.stdout.splitlines()[-1] == "1337"  # the istio-proxy container's user, as Istio injects it
    assert f"err-{mark}" in proc.stderr and "command terminated with exit code 3" in proc.stderr
    line = _transport(kubectl, websockets, since, f"err-{mark}")
    assert ("websocket v5.channel.k8s.io" if websockets else "SPDY/3.1 v4.channel.k8s.io") in line


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_stdin(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    data = bytes(range(256)) * 512  # 128 KiB, every byte value
    proc = subprocess.run([kubectl.path, "exec", "-i", POD, "-c", "app", "--", "sha256sum"],
                          env=kubectl.env(websockets), input=data, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_it_runs_on_a_terminal(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    term = Terminal.start([kubectl.path, "exec", "-it", POD, "-c", "app", "--", "sh"], kubectl.env(websockets))
    try:
        term.expect(b"# ")
        term.type(b"stty size; tty; exit 5\r")
        term.expect(b"/dev/pts/")
        assert b"40 120\r\n" in term.out
        assert term.wait() == 5  # the shell's exit code, through the Status on the error stream
    finally:
        term.kill()


@pytest.mark.parametrize("websockets", TRANSPORTS)
def test_exec_drop_fault_cuts_the_stream(kubectl: Kubectl, websockets: bool) -> None:
    _need_websockets(kubectl, websockets, 29)
    admin_call(kubectl.kubeconfig, "POST", "/_lab/faults", {"exec": {"drop_after_bytes": 100_000, "times": 1}})
    proc = subprocess.run([kubectl.path, "exec", POD, "-c", "app", "--", "head", "-c", "1000000", "/dev/zero"],
                          env=kubectl.env(websockets), capture_output=True, timeout=60)
    # The connection is cut after 100000 bytes: no more arrive (maybe fewer), and no exit status. Over
    # websockets kubectl says so; over SPDY client-go reads the bare end of the error stream as success (exit 0),
    # as it does on any lost connection.
    assert len(proc.stdout) <= 100_000
    assert proc.returncode != 0 if websockets else proc.returncode == 0
    again = kubectl.run("exec", POD, "-c", "app", "--", "echo", "ok", websockets=websockets)
    assert (again.returncode, again.stdout) == (0, "ok\n")  # `times: 1`: the next exec is whole


def test_exec_into_a_container_the_pod_lacks_says_so(kubectl: Kubectl) -> None:
    proc = kubectl.run("exec", POD, "-c", "nope", "--", "true")
    assert proc.returncode == 1
    assert "container nope is not valid for pod healthy" in proc.stderr


def test_auth_can_i_and_list(kubectl: Kubectl) -> None:
    # `pods/exec` on the command line would be the pod named "exec": a subresource is its own flag.
    assert kubectl.run("auth", "can-i", "create", "pods", "--subresource=exec").stdout.strip() == "yes"
    listed = kubectl.run("auth", "can-i", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split() == ["*.*", "[]", "[]", "[*]"]
    admin_call(kubectl.kubeconfig, "POST", "/_lab/faults",
               {"deny": [{"verb": "create", "resource": "pods", "subresource": "exec"}]})
    denied = kubectl.run("auth", "can-i", "create", "pods", "--subresource=exec")
    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    assert kubectl.run("auth", "can-i", "get", "pods", "--subresource=exec").stdout.strip() == "yes"
    rows = dict(re.findall(r"^(\S+)\s+\[.*?\]\s+\[.*?\]\s+(\[.*\])$",
                           kubectl.run("auth", "can-i", "--list").stdout, re.M))
    assert rows["pods/exec"] == "[get]" and rows["pods"] == "[get list watch delete]"
