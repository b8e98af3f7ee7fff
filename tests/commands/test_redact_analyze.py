"""Issue 15: secrets planted where redaction used to miss them stay out of every report format of
``analyze``, and ``--no-redact`` still shows them (the captures are built with dpkt, as bench/gen_pcap.py does)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import dpkt
import pytest

from ..plugins.test_access_log_classes import line, text

FOLDED, NUL_AUTH, WIRE_TOKEN, LOG_TOKEN = "FoldedCookieS3cret", "NulAuthS3cret", "WireTokenS3cret", "LogTokenS3cret"
SIDECAR, APP = ("127.0.0.6", 45000), ("198.18.5.2", 5000)
CALLER, POD = ("198.18.6.1", 40500), ("198.18.6.2", 5000)
# An app answer Envoy rejects (two Transfer-Encoding fields), carrying a folded Set-Cookie and an Authorization
# name with a NUL before its colon: the http-framing finding quotes its header block.
BAD_RESPONSE = ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"
                f"Set-Cookie: theme=dark;\r\n\tsession={FOLDED}\r\nAuthorization\x00: Bearer {NUL_AUTH}\r\n"
                "X-Bad : 1\r\n\r\n").encode("latin-1")
# Envoy's own 504 (tests/plugins/test_wire_classes.py): upstream-timeout names the request in its title.
ENVOY_504 = (b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 24\r\ncontent-type: text/plain\r\n"
             b"date: Tue, 01 Dec 2026 10:54:35 GMT\r\nserver: istio-envoy\r\n\r\n")
T0 = 1_764_583_200.0


def write_pcap(path, client, server, request: bytes, response: bytes, after_s: float) -> None:
    """A handshake, one request and its response: the least a detector needs to see an exchange."""
    c, s = socket.inet_aton(client[0]), socket.inet_aton(server[0])
    packets = [(0.0, True, dpkt.tcp.TH_SYN, 1000, 0, b""), (0.0001, False, dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK, 5000, 1001, b""),
               (0.0002, True, dpkt.tcp.TH_ACK, 1001, 5001, b""),
               (0.0003, True, dpkt.tcp.TH_PUSH | dpkt.tcp.TH_ACK, 1001, 5001, request),
               (0.0003 + after_s, False, dpkt.tcp.TH_PUSH | dpkt.tcp.TH_ACK, 5001, 1001 + len(request), response)]
    with open(path, "wb") as fh:
        w = dpkt.pcap.Writer(fh, linktype=dpkt.pcap.DLT_EN10MB)
        for dt, from_client, flags, seq, ack, payload in packets:
            (src, sport), (dst, dport) = ((c, client[1]), (s, server[1])) if from_client else ((s, server[1]), (c, client[1]))
            tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags, win=65535, data=payload)
            ip = dpkt.ip.IP(src=src, dst=dst, p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=tcp)
            ip.len = len(ip)
            eth = dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
            w.writepkt(bytes(eth), T0 + dt)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    write_pcap(d / "app-lo.pcap", SIDECAR, APP, b"GET /items HTTP/1.1\r\nHost: app\r\n\r\n", BAD_RESPONSE, 0.002)
    write_pcap(d / "pod-eth0.pcap", CALLER, POD, f"GET /cb?state=1&access_token={WIRE_TOKEN} HTTP/1.1\r\n"
               "Host: pod\r\n\r\n".encode(), ENVOY_504, 1.0)
    (d / "access.log").write_text(text(line(
        path=f"/login?ACCESS_TOKEN={LOG_TOKEN}&next=/", code=503, flags="UF",
        details="upstream_reset_before_response_started{connection_failure}", failure="-", duration=1,
        service_time="-")) + "\n")
    return [str(d / "app-lo.pcap"), str(d / "pod-eth0.pcap"), str(d / "access.log")]


def analyze(files, output: str, *extra: str) -> str:
    """The run's output as a reader sees it: Markdown's backslash escapes (frontends/report.py _md) taken out."""
    import re

    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *files, "-o", output, *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1, 2), proc.stderr  # findings make a non-zero exit; a crash would not be here
    out = proc.stdout + proc.stderr
    return re.sub(r"\\([\\`*_\[\]<>&|])", r"\1", out) if output == "markdown" else out


needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="captures are read through tshark")


@needs_tshark
@pytest.mark.parametrize("output", ["json", "text", "markdown"])
def test_planted_secrets_appear_in_no_report(inputs, output):
    out = analyze(inputs, output)
    for detector in ("http-framing", "upstream-timeout"):
        assert detector in out, out
    assert "access_token=<redacted>" in out and "ACCESS_TOKEN=<redacted>" in out and "state=1" in out
    for secret in (FOLDED, NUL_AUTH, WIRE_TOKEN, LOG_TOKEN):
        assert secret not in out, (secret, out)


@needs_tshark
@pytest.mark.parametrize("output", ["json", "text", "markdown"])
def test_no_redact_shows_them_all(inputs, output):
    out = analyze(inputs, output, "--no-redact")
    for secret in (FOLDED, NUL_AUTH, WIRE_TOKEN, LOG_TOKEN):
        assert secret in out, (secret, out)


@needs_tshark
@pytest.mark.parametrize("output", ["json", "text", "markdown"])
def test_a_bare_lf_in_a_header_block_hides_what_follows(tmp_path, output):
    """A bare LF inside the header block (a parser that ends lines there reads another header): the values after
    it stay hidden, though our HTTP/1 reader splits lines on CRLF only and takes them for a header's value."""
    cookie, bearer = "BareLfCookieS3cret", "BareLfBearerS3cret"
    answer = (f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\nSet-Cookie: session={cookie}\r\n"
              f"Transfer-Encoding: chunked\r\nContent-Length: 5\nAuthorization: Bearer {bearer}\r\n\r\n").encode()
    write_pcap(tmp_path / "app-lo.pcap", SIDECAR, APP, b"GET /items HTTP/1.1\r\nHost: app\r\n\r\n", answer, 0.002)
    out = analyze([str(tmp_path / "app-lo.pcap")], output)
    assert "http-framing" in out
    assert cookie not in out and bearer not in out, out
    assert cookie in analyze([str(tmp_path / "app-lo.pcap")], output, "--no-redact")


# Issue 28: the logs people paste carry credentials where the detectors quote them.
AUTH, COOKIE, KEY, SET_COOKIE = "Bearer AuthS3cretLog", "sid=CookieS3cretLog", "ApiKeyS3cretLog", "SetCookieS3cretLog"
SECRETS = (AUTH, COOKIE, KEY, SET_COOKIE)
UC_DETAILS = "upstream_reset_before_response_started{connection_termination}"
CUSTOM = ('[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
          '%RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% "%REQ(AUTHORIZATION)%" "%REQ(COOKIE)%" "%REQ(X-API-KEY)%" '
          '"%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW%')


def analyze_all_formats(*args: str) -> dict[str, str]:
    out = {}
    for fmt in ("text", "json", "markdown"):
        proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *args, "-o", fmt],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, proc.stderr
        out[fmt] = proc.stdout
    return out


def test_a_custom_format_that_logs_credentials_is_quoted_without_them(tmp_path):
    log = tmp_path / "access.log"
    log.write_text(f'[2026-12-03T13:40:07.412Z] "GET /x HTTP/1.1" 503 UC {UC_DETAILS} "{AUTH}" "{COOKIE}" "{KEY}" '
                   f'"10.0.0.2:5000" inbound|5000||\n')
    for fmt, out in analyze_all_formats(str(log), "--log-format", CUSTOM).items():
        assert "stale-keepalive" in out and not any(s in out for s in SECRETS), fmt
    shown = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "--log-format", CUSTOM,
                            "--no-redact", "-o", "json"], capture_output=True, text=True, timeout=60).stdout
    assert AUTH in shown and COOKIE in shown


def test_credentials_a_mesh_adds_to_istios_json_format_are_hidden(tmp_path):
    import json

    log = tmp_path / "access.json.log"
    log.write_text(json.dumps({
        "start_time": "2026-12-03T13:40:07.412Z", "method": "GET", "path": "/x", "protocol": "HTTP/1.1",
        "response_code": 503, "response_flags": "UC", "response_code_details": UC_DETAILS, "duration": 1,
        "bytes_sent": 95, "bytes_received": 0, "upstream_host": "10.0.0.2:5000", "upstream_cluster": "inbound|5000||",
        "Authorization": AUTH, "headers": {"cookie": COOKIE, "x-api-key": KEY}}) + "\n")
    for fmt, out in analyze_all_formats(str(log)).items():
        assert "stale-keepalive" in out and not any(s in out for s in SECRETS), fmt


@pytest.mark.parametrize("shape", ["istio", "istio-json-1.22"])
def test_header_dumps_of_envoys_own_log_are_quoted_without_credentials(tmp_path, shape):
    """A debug log quotes the request's and response's header dumps (`'authorization', '...'`), in Istio's
    >= 1.22 logAsJson inside one line's msg."""
    from pathlib import Path

    from tests.envoy.component_shapes import render_log

    real = Path(__file__).parent.parent / "envoy" / "data" / "component_log" / "stale-keepalive.log"
    lines = []
    for ln in real.read_text().splitlines():
        lines.append(ln)
        if ln.startswith("':authority'"):
            lines += [f"'authorization', '{AUTH}'", f"'cookie', '{COOKIE}'"]
        if ln.startswith("':status'"):
            lines.append(f"'set-cookie', '{SET_COOKIE}'")
    log = tmp_path / "envoy.log"
    log.write_text("\n".join(render_log(lines, shape)) + "\n")
    for fmt, out in analyze_all_formats(str(log)).items():
        assert "stale-keepalive" in out and "envoy log" in out and not any(s in out for s in SECRETS), fmt


# Issue 29, item 2: each header a mesh adds to its JSON access log as a key of its own, in Envoy's lower case.
KEYED = {"authorization": "Bearer KeyedAuthS3cret", "cookie": "sid=KeyedCookieS3cret",
         "x-api-key": "KeyedApiKeyS3cret", "proxy-authorization": "Basic KeyedProxyS3cret",
         "set-cookie": "id=KeyedSetCookieS3cret"}


def keyed_log(path) -> None:
    import json

    path.write_text(json.dumps({
        "start_time": "2026-12-03T13:40:07.412Z", "method": "GET", "path": "/x?token=KeyedTokenS3cret",
        "protocol": "HTTP/1.1", "response_code": 503, "response_flags": "UC", "response_code_details": UC_DETAILS,
        "duration": 1, "bytes_sent": 95, "bytes_received": 0, "upstream_host": "10.0.0.2:5000",
        "upstream_cluster": "inbound|5000||", **KEYED}) + "\n")


def test_every_credential_key_of_a_json_access_log_is_hidden_in_every_report(tmp_path):
    log = tmp_path / "access.json.log"
    keyed_log(log)
    secrets = (*(v.split("=")[-1].split()[-1] for v in KEYED.values()), "KeyedTokenS3cret")
    for fmt, out in analyze_all_formats(str(log)).items():
        assert "stale-keepalive" in out and not [s for s in secrets if s in out], fmt
    shown = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "--no-redact",
                            "-o", "json"], capture_output=True, text=True, timeout=60).stdout
    assert all(s in shown for s in secrets)


async def test_every_credential_key_of_a_json_access_log_is_hidden_on_the_screen(tmp_path):
    from textual.widgets import DataTable

    from kubectl_meshdoctor.commands.analyze import FileSession
    from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp
    from kubectl_meshdoctor.sources.files import CaptureArg

    from ..frontends.tui.test_app import wait_for
    from ..frontends.tui.test_hostile_text import screen_output

    log = tmp_path / "access.json.log"
    keyed_log(log)
    secrets = (*(v.split("=")[-1].split()[-1] for v in KEYED.values()), "KeyedTokenS3cret")
    for size in ((80, 24), (160, 45)):
        app = MeshDoctorApp(FileSession([CaptureArg.parse(str(log))]))
        async with app.run_test(size=size) as pilot:
            table = app.query_one("#findings", DataTable)
            await wait_for(pilot, lambda: table.row_count >= 1)
            await pilot.pause(0.2)
            shown = [screen_output(app)]
            await pilot.press("a")
            await wait_for(pilot, lambda: app.screen.query("#access-log"))
            await pilot.pause(0.2)
            shown.append(screen_output(app))
            await pilot.press("escape", "q")
        assert not [s for s in secrets if s in "\n".join(shown)], size
