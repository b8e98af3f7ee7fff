"""The command line contract: exit codes and one-line errors (DESIGN.md), run as a user runs it."""

import socket
import ssl
import struct
import subprocess
import sys
import threading
from contextlib import contextmanager

import pytest
import yaml


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
    assert_one_line_error(meshdoctor("analyze", str(f)), "not a capture (pcap, pcapng), an Envoy log or an admin dump")


@pytest.mark.parametrize("jobs", ["0", "-1", "1_0", "abc", "1.5"])
def test_analyze_jobs_must_be_a_whole_number_of_at_least_one(jobs, tmp_path):
    proc = meshdoctor("analyze", f"--jobs={jobs}", str(tmp_path / "x.pcap"))
    assert_one_line_error(proc, "--jobs")


def test_analyze_an_empty_directory(tmp_path):
    # A directory is one pod's files (issue 31); one that holds none is one line, as a bad file is.
    assert_one_line_error(meshdoctor("analyze", str(tmp_path)), "no file in it")


def test_analyze_a_pipe_is_refused_not_read_empty():
    """Reading the magic from a pipe would steal it from tshark, which then silently finds nothing."""
    from pathlib import Path

    capture = (Path(__file__).parent.parent / "data" / "lab-collision-eth0.pcap").read_bytes()
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


def test_help_states_the_pod_limit_watch_enforces():
    from kubectl_meshdoctor.commands.watch.live import MAX_PODS

    # argparse wraps the help: the words of the -l line, whitespace aside
    assert f"(at most {MAX_PODS})" in " ".join(meshdoctor("watch", "--help").stdout.split())


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


@contextmanager
def local_server(handle, connections: int = 8):
    """A TCP server on 127.0.0.1 that gives each of at most ``connections`` connections to ``handle(sock)``;
    yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        served = 0
        while served < connections and not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            served += 1
            with conn:
                try:
                    handle(conn)
                except (OSError, ssl.SSLError):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        server.close()


def reset(conn: socket.socket) -> None:
    conn.recv(1024)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends an RST


def kubeconfig_for(tmp_path, server: str):
    kc = tmp_path / "kc"
    kc.write_text(KUBECONFIG_DOWN.replace("http://127.0.0.1:1", server))
    return kc


def test_api_server_that_resets_the_connection_is_one_plain_line(tmp_path):
    with local_server(reset) as port:
        proc = meshdoctor("watch", "pod/x", "--kubeconfig", str(kubeconfig_for(tmp_path, f"http://127.0.0.1:{port}")),
                          "--no-tui")
    assert_one_line_error(proc, f"cannot reach the API server at http://127.0.0.1:{port}: connection reset by peer "
                                "(is the cluster up")


def test_tls_failures_are_one_line_that_names_tls(tmp_path):
    """A certificate nobody in the kubeconfig vouches for, and https to a plain-HTTP port."""
    from meshdoctor_lab.apiserver.tls import make_tls

    tls = make_tls(tmp_path, "127.0.0.1")

    def handshake(conn: socket.socket) -> None:
        tls.context.wrap_socket(conn, server_side=True).recv(1024)

    def plain_http(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    for handle, needle in ((handshake, "TLS: certificate verify failed: self-signed certificate"),
                           (plain_http, "TLS: ")):  # OpenSSL's words vary: "wrong version number", ...
        with local_server(handle) as port:
            kc = kubeconfig_for(tmp_path, f"https://127.0.0.1:{port}")
            proc = meshdoctor("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui")
        assert_one_line_error(proc, f"https://127.0.0.1:{port}: {needle}")
        assert proc.stderr.rstrip().endswith("(is the server URL right, and its certificate-authority in the "
                                             "kubeconfig?)")
        assert "_ssl.c" not in proc.stderr and "[SSL" not in proc.stderr


@pytest.mark.parametrize("where, needle", [
    ("file", "exists and is not a directory"),
    ("under-a-file", "cannot create it: Not a directory"),
])
def test_write_pcap_that_cannot_hold_files_is_one_line_before_any_api_call(tmp_path, where, needle):
    """Checked before anything happens in the cluster: the kubeconfig's server is not even reachable here."""
    kc = tmp_path / "kc"
    kc.write_text(KUBECONFIG_DOWN)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    target = a_file if where == "file" else a_file / "pcaps"
    proc = meshdoctor("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui", "--write-pcap", str(target))
    assert_one_line_error(proc, f"--write-pcap {target}: {needle}")


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

    f = str(Path(__file__).parent.parent / "data" / "lab-collision-eth0.pcap")
    once, twice = meshdoctor("analyze", f, "-o", "json"), meshdoctor("analyze", f, f, "-o", "json")
    assert once.stdout == twice.stdout and once.returncode == twice.returncode == 1


@pytest.mark.parametrize("data, needle, hint", [
    ({"certificate-authority-data": "bm90IGEgY2VydA=="}, "TLS: no certificate or crl found",
     "its certificate-authority in the kubeconfig?"),
    ({"client-certificate-data": "Zm9v", "client-key-data": "YmFy"},
     "TLS: the kubeconfig's client certificate or key cannot be loaded", "client-key in the kubeconfig a pair?"),
])
def test_certificate_data_that_is_no_certificate_is_one_line(tmp_path, data, needle, hint):
    """Base64 that decodes to no PEM: the client only finds out at the first request, once connected."""
    with local_server(lambda conn: conn.recv(1024)) as port:
        doc = yaml.safe_load(KUBECONFIG_DOWN.replace("http://127.0.0.1:1", f"https://127.0.0.1:{port}"))
        where = doc["clusters"][0]["cluster"] if "certificate-authority-data" in data else doc["users"][0]["user"]
        where.update(data)
        kc = tmp_path / "kc"
        kc.write_text(yaml.safe_dump(doc))
        proc = meshdoctor("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui")
    assert_one_line_error(proc, needle)
    assert proc.stderr.rstrip().endswith(f"{hint})")


@pytest.mark.parametrize("text, seconds", [("0", None), ("7", 7.0), ("30s", 30.0), ("1m30s", 90.0),
                                           ("500ms", 0.5), ("1h", 3600.0), ("1.5s", 1.5)])
def test_request_timeout_reads_as_kubectl_reads_it(text, seconds):
    from kubectl_meshdoctor.kube.duration import parse_request_timeout

    assert parse_request_timeout(text) == seconds


@pytest.mark.parametrize("text", ["-1", "1.5", "abc", "1x", "s", "", "1m-3s", "²"])
def test_request_timeout_that_kubectl_refuses_is_one_usage_line(text):
    proc = meshdoctor("watch", "pod/x", f"--request-timeout={text}")
    assert_one_line_error(proc, "argument --request-timeout: a number of seconds or a duration such as 30s")


def test_request_timeout_0_is_no_timeout_not_an_internal_error(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text(KUBECONFIG_DOWN)
    proc = meshdoctor("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui", "--request-timeout", "0")
    assert_one_line_error(proc, "cannot reach the API server at http://127.0.0.1:1: connection refused")


@pytest.mark.parametrize("command", [(), ("lab",), ("lab", "up")])
def test_help_never_suggests_a_sudo_that_cannot_find_the_plugin(command):
    """sudo's secure_path drops the venv's (or krew's) bin, so `sudo kubectl meshdoctor lab up` finds no plugin
    (issue 16): every sudo example gives sudo the plugin's own path."""
    text = meshdoctor(*command, "--help").stdout
    assert "sudo kubectl meshdoctor" not in text
    sudos = [line.strip() for line in text.splitlines() if line.strip().startswith("sudo ")]
    assert all(line.startswith('sudo "$(command -v kubectl-meshdoctor)" lab ') for line in sudos), sudos
    if command != ("lab", "up"):
        assert sudos  # the main and lab help show how to run the lab as root


def test_a_socks_proxy_url_without_pysocks_is_one_line(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text(KUBECONFIG_DOWN.replace('server: "http://127.0.0.1:1"}',
                                          'server: "http://127.0.0.1:1", proxy-url: "socks5://127.0.0.1:1"}'))
    # PySocks is no dependency of ours: the client library then cannot build the proxy.
    proc = meshdoctor("watch", "pod/x", "--kubeconfig", str(kc), "--no-tui")
    assert_one_line_error(proc, "the kubeconfig's proxy-url needs the Python module socks")


@pytest.mark.parametrize("text", ["99999999999999999999", "9" * 400 + "h", "400d"])
def test_a_request_timeout_no_clock_can_hold_is_one_usage_line(text):
    assert_one_line_error(meshdoctor("watch", "pod/x", f"--request-timeout={text}"), "argument --request-timeout")


def test_lab_down_of_no_lab_says_so_and_succeeds(tmp_path):
    proc = meshdoctor("lab", "down", "--name", "mdnolab", "--state-dir", str(tmp_path / "none"))
    assert proc.returncode == 0 and proc.stdout.strip() == f"no lab in {tmp_path / 'none'}: nothing to take down"
    assert not (tmp_path / "none").exists()


def test_lab_up_help_lists_every_scenario_with_the_fixes_it_prints():
    from meshdoctor_lab.scenario_fixes import printed_fixes
    from meshdoctor_lab.applied_fixes import LAB_FIXES
    from meshdoctor_lab.scenarios.table import SCENARIOS

    text = meshdoctor("lab", "up", "--help").stdout
    rows: dict[str, str] = {}
    last = ""
    for line in text.split("--fix NAME):\n", 1)[1].splitlines():
        if line.startswith("  ") and line.split()[0] in SCENARIOS:
            last = line.split()[0]
            rows[last] = line.split(None, 1)[1]
        elif last and line.startswith("  ") and line.strip():  # a row wrapped to the terminal's width
            rows[last] += " " + line.strip()
        else:
            last = ""
    assert set(rows) == set(SCENARIOS)
    for scenario in SCENARIOS:
        own = [f.name for f in LAB_FIXES.get(scenario, ())]  # a class no detector prints a fix for yet
        assert rows[scenario] == (", ".join(f.name for f in printed_fixes(scenario)) or ", ".join(own) or "-")
    assert rows["outlier"] == "min-health-percent, max-ejection-percent"


def test_a_refused_lab_up_says_only_why(tmp_path):
    """Nothing is created for a scenario that does not exist, so nothing says "creating lab" first."""
    proc = meshdoctor("lab", "up", "--name", "mdnoscenario", "--pods", "nosuch", "--state-dir", str(tmp_path / "s"))
    assert_one_line_error(proc, "nosuch")
    assert "creating lab" not in proc.stderr


def test_two_fixes_for_one_lab_pod_are_refused_before_anything_is_made(tmp_path):
    proc = meshdoctor("lab", "up", "--name", "mdtwofix", "--state-dir", str(tmp_path / "s"), "--pods", "slow-app",
                      "--fix", "slow-app=caller-no-half-close", "--fix", "slow-app=caller-timeout")
    assert_one_line_error(proc, "pod slow-app is given two fixes (caller-no-half-close, caller-timeout)")
    assert not (tmp_path / "s").exists()


def test_several_targets_and_files_may_follow_flags_as_kubectl_takes_them(tmp_path):
    """`watch pod/a -n shop pod/b`, `analyze a/ -o json b/`: the words after a flag are still the command's."""
    from kubectl_meshdoctor.cli import _parse, build_parser

    parser = build_parser()
    args = _parse(parser, ["watch", "pod/a", "-n", "shop", "pod/b", "--no-tui"])
    assert (args.target, args.namespace, args.no_tui) == (["pod/a", "pod/b"], "shop", True)
    assert _parse(parser, ["analyze", "a/", "-o", "json", "b/"]).files == ["a/", "b/"]
    assert_one_line_error(meshdoctor("watch", "pod/a", "--kubeconfig", str(tmp_path / "kc"), "--bogus"),
                          "unrecognized arguments: --bogus")
    assert_one_line_error(meshdoctor("lint", "pod/a", "pod/b"), "unrecognized arguments: pod/b")
    assert_one_line_error(meshdoctor("watch", "pod/a", "-l", "app=a"), "not both")
