"""The TLS record reader on real Envoy 1.40 mTLS (tests/data/envoy-1.40-mesh: the caller sidecar's ClientHello to
the pod's sidecar, the ServerHello, and the pod's close_notify at its idle close), on records built by the RFC,
and on any bytes at all (it never raises). And the capture's reading of them: tshark's prefilter, the pre-pass
and the live BPF keep those records and no other application data."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.live.pod_script import lean_filter
from kubectl_meshdoctor.sources import tshark
from kubectl_meshdoctor.sources.tls_records import RECORD_PREFIXES, parse_tls_start

DATA = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40-mesh"
IDLE = DATA / "downstream-idle" / "server" / "eth0.pcap"
SNI = "outbound_.5000_._.downstream-idle.mesh31ev.svc.cluster.local"


def _payload(path: Path, frame: int) -> bytes:
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-Y", f"frame.number == {frame}", "-T", "fields",
                          "-e", "tcp.payload"], capture_output=True, text=True, check=True).stdout.strip()
    return bytes.fromhex(out.replace(":", ""))


def test_a_real_client_hello_names_the_service_port_and_alpn():
    hello = parse_tls_start(_payload(IDLE, 4))
    assert hello is not None and hello.is_client_hello and hello.complete
    assert hello.sni == SNI
    assert hello.alpn == ("istio-http/1.1", "istio", "http/1.1")
    assert hello.describe() == f"ClientHello SNI {SNI} ALPN istio-http/1.1,istio,http/1.1"


def test_a_real_server_hello_says_tls_1_3():
    hello = parse_tls_start(_payload(IDLE, 6))
    assert hello is not None and hello.is_server_hello and hello.selected_version == 0x0304
    assert hello.describe() == "ServerHello TLS 1.3"


def test_the_pods_close_is_an_encrypted_alert_and_app_data_is_not_read():
    alert = parse_tls_start(_payload(IDLE, 15))
    assert alert is not None and alert.is_encrypted_alert and alert.length == 19
    assert parse_tls_start(_payload(IDLE, 9)) is None  # the caller's request: application data of 220 bytes


def test_a_hello_cut_by_the_segment_is_a_client_hello_of_no_known_name():
    whole = _payload(IDLE, 4)
    for cut in (5, 9, 60, len(whole) - 1):
        hello = parse_tls_start(whole[:cut])
        assert hello is not None and hello.is_client_hello is (cut >= 6) and not hello.complete
        assert hello.sni is None and hello.alpn == ()


def test_a_plaintext_alert_has_its_level_and_description():
    alert = parse_tls_start(bytes.fromhex("1503030002022a"))  # fatal bad_certificate (RFC 8446 section 6)
    assert alert is not None and alert.is_alert and alert.alert == (2, 42)
    assert alert.describe() == "TLS alert description 42 (fatal)"
    notify = parse_tls_start(bytes.fromhex("15030300020100"))
    assert notify is not None and notify.short() == "alert close_notify"


def test_names_with_control_bytes_are_shown_as_question_marks():
    whole = bytearray(_payload(IDLE, 4))
    at = whole.find(b"outbound_")
    whole[at] = 0x1B  # ESC
    hello = parse_tls_start(bytes(whole))
    assert hello is not None and hello.sni == "?" + SNI[1:]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(RECORD_PREFIXES + (b"\x16\x03\x01", b"\x16\x03\x03\x00\x30\x01", b"")), st.binary(max_size=300))
def test_never_raises_on_any_bytes(prefix, tail):
    got = parse_tls_start(prefix + tail)
    assert got is None or got.content_type in (21, 22, 23)


def test_never_raises_on_a_real_hello_with_any_byte_changed():
    whole = _payload(IDLE, 4)

    @settings(max_examples=300, deadline=None)
    @given(st.integers(0, len(whole) - 1), st.integers(0, 255))
    def check(at, value):
        changed = bytearray(whole)
        changed[at] = value
        parse_tls_start(bytes(changed))

    check()


def _read(path: Path) -> list:
    events: list = []
    asyncio.run(tshark.read_file(str(path), path.name, "eth0", events.append))
    return events


def test_the_prefilter_keeps_the_tls_records_and_no_application_data():
    events = _read(IDLE)
    assert [(e.frame, e.tls.short() if e.tls else e.flags.short()) for e in events] == [
        (1, "S"), (2, "S."), (4, "ClientHello"), (6, "ServerHello"), (15, "encrypted alert"), (16, "R.")]


def test_the_live_bpf_keeps_what_the_prefilter_keeps(tmp_path):
    out = tmp_path / "lean.pcap"
    for iface in ("lo", "eth0"):
        subprocess.run(["tcpdump", "-r", str(IDLE), "-w", str(out), lean_filter(iface)], check=True,
                       capture_output=True)
        kept = {e.frame: e for e in _read(out)}
        # frames renumbered by the copy: compare what they are
        assert sorted((e.tls.short() if e.tls else e.flags.short()) for e in kept.values()) == sorted(
            ["S", "S.", "ClientHello", "ServerHello", "encrypted alert", "R."])
