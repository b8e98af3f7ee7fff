"""Issue 29, items 8, 9 and 10: an API server that accepts connections and never answers, a SIGKILLed run, and no
writable temporary directory.

- A signal ends `watch` at once while it waits on such a server (the client's own timeouts and retries took
  117-119 s), with one line and exit 2.
- The Kubernetes client keeps the kubeconfig's client key in files for the TLS stack: they are in a directory of
  ours (0700), removed at exit, and by the next run after a SIGKILL; never left in TMPDIR.
- No usable temporary directory: `analyze` of a log needs none, `watch` says so in one line.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ..waiting import wait_until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the client key is made with openssl")


@pytest.fixture(scope="module")
def client_key(tmp_path_factory) -> tuple[bytes, bytes]:
    """A client certificate and key (PEM), as a kubeconfig's client-certificate-data and client-key-data hold."""
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "k.pem"),
                    "-out", str(d / "c.pem"), "-subj", "/CN=meshdoctor-test", "-days", "1"],
                   check=True, capture_output=True)
    return (d / "c.pem").read_bytes(), (d / "k.pem").read_bytes()


@pytest.fixture
def hung_server() -> Iterator[tuple[int, list]]:
    """A TCP server on loopback that accepts every connection and never answers: (its port, the connections)."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1], held
    finally:
        srv.close()
        for conn in held:
            conn.close()


def kubeconfig(path: Path, port: int, client_key: tuple[bytes, bytes]) -> Path:
    cert, key = client_key
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"client-certificate-data": base64.b64encode(cert).decode(),
                                         "client-key-data": base64.b64encode(key).decode()}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def watch(kc: Path, tmpdir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "watch", "pod/x", "--kubeconfig", str(kc),
                             "--no-tui"], env={**os.environ, "TMPDIR": str(tmpdir)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def holding_the_key(tmpdir: Path, key: bytes) -> list[Path]:
    """Every file under ``tmpdir`` whose bytes are the key's."""
    return [p for p in tmpdir.rglob("*") if p.is_file() and p.read_bytes() == key]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_ends_a_watch_waiting_on_a_hung_server_at_once(tmp_path, hung_server, client_key, sig):
    port, held = hung_server
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = watch(kubeconfig(tmp_path / "kc", port, client_key), tmpdir)
    try:
        wait_until("the watch waiting on the API server", 30, lambda: held and holding_the_key(tmpdir, client_key[1]))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=5)  # the client alone would wait 30 s, four times
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2 and out == ""
    assert err.strip().count("\n") == 0 and "stopped while waiting for the API server" in err, err
    assert holding_the_key(tmpdir, client_key[1]) == [] and list(tmpdir.iterdir()) == []  # removed at exit


def test_a_sigkilled_run_leaves_the_key_only_in_a_private_directory_the_next_run_removes(
        tmp_path, hung_server, client_key):
    port, held = hung_server
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    kc = kubeconfig(tmp_path / "kc", port, client_key)
    proc = watch(kc, tmpdir)
    try:
        found = wait_until("the key in a file", 30, lambda: holding_the_key(tmpdir, client_key[1]))
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for path in found:
        private = path.parent
        assert private.parent == tmpdir and private.name.startswith(f".meshdoctor-kube-{proc.pid}-"), path
        assert private.stat().st_mode & 0o777 == 0o700
    assert holding_the_key(tmpdir, client_key[1])  # SIGKILL gave no time to remove it
    # The next run (any command that connects) removes what the dead one left, whatever becomes of it.
    refused = kubeconfig(tmp_path / "kc-refused", _closed_port(), client_key)
    nxt = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "watch", "pod/x", "--kubeconfig", str(refused),
                          "--no-tui", "--request-timeout", "5s"], env={**os.environ, "TMPDIR": str(tmpdir)},
                         capture_output=True, text=True, timeout=120)
    assert nxt.returncode == 2 and nxt.stderr.strip().count("\n") == 0, nxt.stderr
    assert holding_the_key(tmpdir, client_key[1]) == [] and list(tmpdir.iterdir()) == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a mount namespace with read-only /tmp and /var/tmp needs root")
def test_no_writable_temporary_directory_is_one_line_or_no_matter(tmp_path, client_key, request):
    """Read-only /tmp and /var/tmp (tmpfs mounted read-only in a mount namespace of the test's own), the working
    directory among them: nowhere to write, even as root."""
    log = Path(__file__).parent.parent / "envoy" / "data" / "istio_access_log.txt"
    here = Path(__file__).resolve().parent.parent.parent
    shm = Path("/dev/shm") / tmp_path.name  # outside the mounts that hide /tmp and /var/tmp
    shm.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(shm, ignore_errors=True))
    kc = kubeconfig(shm / "kc", _closed_port(), client_key)

    # The checkout and its venv may live under /tmp themselves (a CI clone): they are bound back into the
    # read-only tmpfs, so only /tmp's and /var/tmp's own roots are unwritable, as a full or read-only /tmp is.
    keep = sorted({str(p) for p in (here, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
                   if str(p).startswith(("/tmp/", "/var/tmp/"))})
    saved = shm / "saved"
    binds = "".join(f" && mkdir -p {k} && mount --bind {saved}{k} {k}" for k in keep)

    def run(*args: str) -> subprocess.CompletedProcess:
        script = (f"mount --make-rprivate / && mkdir -p {saved}/tmp {saved}/var/tmp"
                  f" && mount --bind /tmp {saved}/tmp && mount --bind /var/tmp {saved}/var/tmp"
                  f" && mount -t tmpfs none /tmp && mount -t tmpfs none /var/tmp{binds}"
                  f" && mount -o remount,ro /tmp && mount -o remount,ro /var/tmp"
                  f" && cd /tmp && exec {sys.executable} -m kubectl_meshdoctor " + " ".join(args))
        return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": "/tmp", "PYTHONPATH": str(here)})

    analyzed = run("analyze", str(log), "-o", "json")
    assert analyzed.returncode == 1 and "internal error" not in analyzed.stderr, analyzed.stderr
    watched = run("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui")
    assert watched.returncode == 2 and watched.stderr.strip().count("\n") == 0, watched.stderr
    assert "no writable temporary directory" in watched.stderr and "set TMPDIR" in watched.stderr
