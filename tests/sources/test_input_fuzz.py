"""The sources' parsers of outside bytes (kernel counters, HTTP/1 starts) and the followed sidecar log, on
input no kernel, peer or Envoy sent: a value comes back, and one bad line is dropped alone."""

import asyncio
import json
import re
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.kube.logs import LogFollower
from kubectl_meshdoctor.sources.http1 import parse_http_start
from kubectl_meshdoctor.live.kernel import parse_counters, parse_listeners
from kubectl_meshdoctor.sources.proxy_log import ProxyLogStream
from kubectl_meshdoctor.sources.tshark import _header_block
from kubectl_meshdoctor_plugins.http_framing import framing_violations
from tests.envoy.conftest import access_log_lines
from tests.live.test_kernel import PROC_NET_TCP, SAMPLE

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HUGE = "9" * 5000
BREAKERS = ("²", "٣", HUGE, "F" * 5000, "-", "", "zz", "-1", "1e999", ":", "0A")
KERNEL = SAMPLE + PROC_NET_TCP


@st.composite
def mutated(draw, text: str) -> str:
    for _ in range(draw(st.integers(1, 4))):
        words = list(re.finditer(r"[^\s:]+", text))
        m = draw(st.sampled_from(words))
        new = draw(st.sampled_from(BREAKERS) | st.text(max_size=12))
        text = text[:m.start()] + new + text[m.end():]
    return text


@FUZZ
@given(st.text() | mutated(KERNEL))
def test_kernel_parsers_return_a_value(text):
    counters = parse_counters(text)
    assert all(isinstance(v, int) for v in counters.values())
    assert all(0 <= port <= 0xFFFF for _, port in parse_listeners(text))


def test_kernel_breakers_are_skipped_not_raised():
    text = (f"TcpExt: A B C\nTcpExt: ² {HUGE} 5\n#conntrack\nentries drop insert_failed\nzz gg 00000001\n"
            f"#tcp\n 0: 0100007F:{'F' * 5000} 00000000:0000 0A\n 1: 0100007F:²² 00000000:0000 0A\n")
    assert parse_counters(text) == {"TcpExtC": 5, "ConntrackInsertFailed": 1, "ConntrackDrop": 0}
    assert parse_listeners(text) == frozenset()


@FUZZ
@given(st.text(alphabet=st.characters(max_codepoint=255), max_size=40)
       | st.sampled_from(["Host: a", "X-Bad : 1", ":x", "a:", " folded", "k:\tv \t", "n\x7f: v", "a:b:c",
                         "X-Request-Id: 7", "x-request-id", "Cookie: a=1", "Cookie : a=1", "x-b3-spanid:" + "f" * 200,
                         "Server: " + "e" * 200, "\tsession=s3cret;x=a", " folded: with a colon", "Cookie : a=1"]))
def test_a_field_line_is_a_token_then_a_colon(text):
    """RFC 9110 section 5.1 as one pattern says it, against the faster partition the parser uses; a field line
    is kept for the messages after it as reusable says, whether its name was met before or not, and a raw line
    never is (a folded credential's continuation carries no name to tell it by)."""
    from kubectl_meshdoctor.sources.http1 import _RAW, _FieldLines, _name_kind, reusable

    m = re.fullmatch(r"([!-9;-~]+):(.*)", text, re.S)
    want = (m.group(1), m.group(2).strip(" \t")) if m else _RAW
    for lines in (_FieldLines(), _warm(text)):  # its name new to the table, then known
        assert lines[text] == want
        assert (text in lines) == (want is not _RAW and reusable(want[0], len(text)))
        assert all(_RAW is not lines[t] for t in lines)
        assert all(_name_kind(n) for n in lines._names)  # names of field lines only, never a raw line's text


def _warm(text: str):
    """A line table that has met ``text``'s name on another line (a request id seen in an earlier request)."""
    from kubectl_meshdoctor.sources.http1 import _FieldLines

    lines = _FieldLines()
    lines[text.partition(":")[0] + ":other value"]
    return lines


@FUZZ
@given(st.binary() | st.sampled_from([b"GET / HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n"]).flatmap(
    lambda start: st.binary().map(lambda rest: start + rest)))
def test_http_start_returns_a_value(payload):
    msg = parse_http_start(payload)
    if msg is not None:  # and the header checks http-framing runs on it, redacted or not
        for redact in (True, False):
            assert all(isinstance(v, str) for v in framing_violations(msg, redact))


def test_a_bad_access_log_line_mid_stream_drops_that_line_alone():
    good = access_log_lines()[:2]
    bad = ['{"start_time":"2025-06-12T08:14:01Z","response_code":1e999}', "[" * 100_000,
           '{"start_time":"2025-06-12T08:14:01Z","response_code":"²"}']
    stream = b"\n".join([good[0].encode(), *(b.encode() for b in bad), b"\xff\xfe not utf-8", good[1].encode(), b""])
    loop = asyncio.new_event_loop()
    events = []
    log = ProxyLogStream("pod/pod istio-proxy", loop, events.append)
    follower = LogFollower(None, "ns", "pod", "istio-proxy", log.line, log.burst)
    for i in range(0, len(stream), 4096):  # as the API hands the stream over, lines cut across chunks
        follower.feed(stream[i:i + 4096])
    # One turn of the loop runs every batch the stream queued on it (call_soon_threadsafe): a drain, not a wait.
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    assert [e.entry.raw for e in events] == good
    # The two that start as access-log lines are counted (the report's problem); the rest are other log lines.
    assert follower.lines == 3 + len(bad) and follower.dropped == 2 and follower.drop_reason == "ValueError"


def test_a_line_the_handler_raises_on_is_dropped_and_counted_and_following_goes_on():
    seen = []
    follower = LogFollower(None, "ns", "pod", "istio-proxy", lambda line: seen.append(json.loads(line)))
    follower.feed(b'{"a": 1}\n{"a": \n{"a": 1e999}\n' + b"[" * 100_000 + b'\n{"a": 2}\n')
    assert seen == [{"a": 1}, {"a": float("inf")}, {"a": 2}]
    assert follower.dropped == 2 and follower.drop_reason == "JSONDecodeError"  # the kind: never the line's text


def test_unreadable_access_log_lines_of_a_file_are_counted_by_line_not_quoted(tmp_path):
    """analyze of a log: the lines that start as access-log lines but cannot be read are one problem, with
    their count and the first one's line number; Envoy's own log lines are not counted; no line is quoted."""
    good = access_log_lines()[:2]
    secret = "Bearer-s3cr3t"
    bad_text = good[0].replace('" 200 ', '" ²00 ', 1).replace("python-requests/2.32.3", secret)
    assert bad_text != good[0] and secret in bad_text
    bad_json = '{"start_time":"2025-06-12T08:14:01Z","response_code":"%s"}' % secret
    envoy_own = "[2025-06-12 08:14:01.207][15][warning][config] gRPC config stream closed"
    log = tmp_path / "proxy.log"
    log.write_text("\n".join([good[0], envoy_own, bad_text, good[1], bad_json, ""]))
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "-o", "json"],
                          capture_output=True, text=True, timeout=60)
    report = json.loads(proc.stdout)
    (problem,) = [p for p in report["problems"] if "could not be read" in p["what"]]
    assert problem["what"].startswith("2 line(s)") and problem["what"].endswith("the first is line 3"), problem
    assert secret not in proc.stdout + proc.stderr


_PIECES = st.sampled_from([b"\r\n", b"\r\n\r\n", b"\r", b"\n", b"\x0d\x0a\x0d", b"\xd0\xa0\xd0\xa0", b"\x00", b"a"])


@FUZZ
@given(st.sampled_from([b"GET / HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n", b""]),
       st.lists(st.binary(max_size=8) | _PIECES, max_size=12).map(b"".join), st.booleans())
def test_only_the_header_block_of_tsharks_hex_is_parsed_and_it_parses_as_the_whole(start, rest, colons):
    """tshark's hex of a payload is cut after its first CRLF CRLF at a byte boundary (never inside a byte, as
    in 0xD0 0xA0), in tshark 4's format and tshark 3's colon-separated one; the parse is that of the whole."""
    payload = start + rest
    text = payload.hex(":") if colons else payload.hex()
    end = payload.find(b"\r\n\r\n")
    assert _header_block(text) == (payload if end < 0 else payload[:end + 4])
    assert parse_http_start(_header_block(text)) == parse_http_start(payload)
