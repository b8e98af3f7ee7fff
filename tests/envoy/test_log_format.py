"""The format compiler (envoy/log_format.py) and the known formats (envoy/istio_formats.py): Envoy's parser rules,
every default format read back into the right fields, the user's own formats (TEXT and JSON, any START_TIME
spec), wrapped or not, and lines no format reads whole (envoy/partial_line.py)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.access_log import PARTIAL, parse_line, read_line
from kubectl_meshdoctor.envoy.istio_formats import ENVOY_DEFAULT, JSON_FORMATS, TEXT_FORMATS
from kubectl_meshdoctor.envoy.log_format import LogFormatError, Operator, compile_format, tokenize
from kubectl_meshdoctor.envoy.wrappers import unwrap
from meshdoctor_lab.bootstrap import ISTIO_JSON_FORMAT, ISTIO_TEXT_FORMAT

from .render import render_json, render_text
from .test_wrappers import cri, docker_json, grep_hn, json_string, kubectl_prefix, kubectl_timestamps, stern

def unwrap_ts(line: str) -> float:
    ts = unwrap(line).ts
    assert ts is not None
    return ts


FIELDS = ("method", "path", "protocol", "code", "flags", "details", "termination_details", "upstream_failure",
          "bytes_received", "bytes_sent", "duration_ms", "upstream_service_time", "x_forwarded_for", "user_agent",
          "request_id", "authority", "upstream_host", "upstream_cluster", "upstream_local", "downstream_local",
          "downstream_remote", "requested_server_name", "route_name")

CUSTOM_TEXT = (
    # An nginx-like order with quoted headers last and Envoy's long flag names.
    '%DOWNSTREAM_REMOTE_ADDRESS% - [%START_TIME(%d/%b/%Y:%T %z)%] "%REQ(:METHOD)% %REQ(:PATH)% %PROTOCOL%" '
    '%RESPONSE_CODE% %BYTES_SENT% %RESPONSE_FLAGS_LONG% "%REQ(USER-AGENT)%"\n',
    # Epoch times, a header cut to 8 characters, 100%% as a literal, upstream address instead of host.
    "%START_TIME(%s.%3f)% %RESPONSE_CODE% %RESPONSE_FLAGS% %DURATION%ms 100%% %REQ(X-REQUEST-ID):8% "
    "%UPSTREAM_REMOTE_ADDRESS% %UPSTREAM_CLUSTER_RAW% %RESPONSE_CODE_DETAILS%",
    # Separators other than spaces, Host for the authority.
    "start=%START_TIME(%Y-%m-%dT%H:%M:%E3SZ)%|code=%RESPONSE_CODE%|flags=%RESPONSE_FLAGS%|host=%REQ(HOST)%|"
    "up=%UPSTREAM_HOST%|route=%ROUTE_NAME%",
)
CUSTOM_JSON = (
    '{"ts": "%START_TIME%", "code": "%RESPONSE_CODE%", "flags": "%RESPONSE_FLAGS%", "up": "%UPSTREAM_HOST%", '
    '"req": {"id": "%REQ(X-REQUEST-ID)%", "line": "%REQ(:METHOD)% %REQ(:PATH)%"}, "constant": "mesh-a"}',
    '{"when": "%START_TIME(%s)%", "status": "%RESPONSE_CODE%", "details": "%RESPONSE_CODE_DETAILS%", '
    '"bytes": "%BYTES_SENT%", "peer": "%DOWNSTREAM_REMOTE_ADDRESS%"}',
)

# --- Envoy's parser rules --------------------------------------------------------------------------------


def test_tokenize_as_envoy_splits():
    assert tokenize('[%START_TIME%] "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH):10%" 100%%\n') == (
        "[", Operator("START_TIME"), '] "', Operator("REQ", "X-ENVOY-ORIGINAL-PATH?:PATH", 10), '" 100%\n')
    assert tokenize("%START_TIME(%s.%3f)%") == (Operator("START_TIME", "%s.%3f"),)


@pytest.mark.parametrize("fmt, says", [
    ("%RESPONSE_CODE% 50%", "no command operator at position 18"),
    ("%response_code%", "no command operator"),
    ("%REQ% %RESPONSE_CODE%", "names no header"),
    ("%REQ(A?B?C)% %RESPONSE_CODE%", "one alternative"),
    ("%START_TIME% %DURATION%", "neither %RESPONSE_CODE% nor %RESPONSE_FLAGS%"),
    ("%START_TIME(%c)% %RESPONSE_CODE%", "%c cannot be read back"),
    ("", "empty"),
    ('{"code": %RESPONSE_CODE%}', "not a JSON object"),
    ('{"at": "%START_TIME%"}', "neither"),
])
def test_formats_envoy_or_meshdoctor_refuse_say_why_in_one_line(fmt, says):
    with pytest.raises(LogFormatError, match=re.escape(says)) as e:
        compile_format(fmt)
    assert "\n" not in str(e.value)


def test_the_labs_formats_are_istios_newest():
    assert ISTIO_TEXT_FORMAT == TEXT_FORMATS[0].format
    assert ISTIO_JSON_FORMAT == json.loads(JSON_FORMATS[0].format)


def test_every_known_format_names_its_versions_and_source():
    for f in (*TEXT_FORMATS, *JSON_FORMATS):
        assert f.istio and re.search(r"\w+/\w+:\S+", f.source), f.name
    assert len({f.name for f in (*TEXT_FORMATS, *JSON_FORMATS)}) == len(TEXT_FORMATS) + len(JSON_FORMATS)


# --- lines of every format, read back ----------------------------------------------------------------------

_word = st.from_regex(r"[A-Za-z0-9._:/|-]{1,24}", fullmatch=True).filter(lambda s: s != "-")
_header = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1, max_size=30).filter(
    lambda s: s.strip() == s and s != "-" and '" ' not in s and not s.endswith('"') and not s.startswith('"'))
_address = st.builds(lambda a, p: f"10.{a // 256}.{a % 256}.7:{p}", st.integers(0, 65535), st.integers(1, 65535))
_details = st.from_regex(r"[a-z]+(_[a-z]+){0,3}(\{[a-z_:|]{1,20}\})?", fullmatch=True)
_flags = st.lists(st.sampled_from(["UF", "URX", "UC", "UH", "DC", "UT", "UPE", "NR", "DPE"]), max_size=3, unique=True)


@st.composite
def entries(draw) -> dict:
    """A request as a format's operators see it; None is a value Envoy prints as `-`."""
    opt = lambda s: draw(st.none() | s)  # noqa: E731
    return {
        "ts": draw(st.integers(1_500_000_000_000, 2_000_000_000_000)) / 1000.0,
        "method": draw(st.sampled_from(["GET", "POST", "DELETE", "PATCH"])),
        "path": draw(st.from_regex(r"/[A-Za-z0-9/._~?=&-]{0,30}", fullmatch=True)),
        "protocol": draw(st.sampled_from(["HTTP/1.1", "HTTP/2", "HTTP/1.0"])),
        "code": draw(st.sampled_from([0, 200, 404, 426, 502, 503, 504])), "flags": tuple(draw(_flags)),
        "details": opt(_details), "termination_details": opt(_details), "upstream_failure": opt(_header),
        "bytes_received": draw(st.integers(0, 10**9)), "bytes_sent": draw(st.integers(0, 10**9)),
        "duration_ms": draw(st.integers(0, 10**6)), "upstream_service_time": opt(st.integers(0, 10**5)),
        "x_forwarded_for": opt(_header), "user_agent": opt(_header), "request_id": opt(_word),
        "authority": opt(_word), "upstream_host": opt(_address), "upstream_cluster": opt(_word),
        "upstream_local": opt(_address), "downstream_local": opt(_address), "downstream_remote": opt(_address),
        "requested_server_name": opt(_word), "route_name": opt(_header),
    }


def expected(entry: dict, fields: frozenset[str]) -> dict:
    """What a line of ``entry`` says of the ``fields`` its format carries."""
    return {name: tuple(entry[name]) if name == "flags" else entry[name] for name in FIELDS if name in fields}


def read_back(line: str, fmt=None) -> dict:
    read = read_line(line, fmt)
    assert read is not None, line
    return read


_WRAPS = st.sampled_from([lambda s: s, kubectl_timestamps, lambda s: kubectl_prefix(kubectl_timestamps(s)), cri,
                          docker_json, stern, grep_hn, json_string])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=entries(), known=st.sampled_from(TEXT_FORMATS), wrap=_WRAPS)
def test_every_known_text_format_reads_back(entry, known, wrap):
    compiled = compile_format(known.format, known.name)
    line = render_text(known.format, entry)
    read = read_back(wrap(line))
    assert read.unwrapped.text == line
    # istio-1.9 and istio-1.23 differ only in the cluster operator: the same shape, read by the newer name.
    assert read.format == known.name or {read.format, known.name} == {"istio-1.9", "istio-1.23"}
    e = read.entry
    got = {name: getattr(e, name) for name in FIELDS if name in compiled.fields}
    assert got == expected(entry, compiled.fields)
    assert e.ts == pytest.approx(entry["ts"], abs=1e-6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=entries(), known=st.sampled_from(TEXT_FORMATS), wrap=_WRAPS)
def test_a_known_text_line_pasted_without_its_start_time_reads_back(entry, known, wrap):
    """A ticket's copy of a line with its leading `[START_TIME] ` cut off: the fields the format carries, and the
    time the wrapper gives (when the line was written, less the duration), else 0.0 (unknown)."""
    compiled = compile_format(known.format, known.name)
    line = render_text(known.format, entry)
    untimed = line[line.index("] ") + 2:]
    assert untimed.startswith('"')
    read = read_back(wrap(untimed))
    assert read.unwrapped.text == untimed
    e = read.entry
    got = {name: getattr(e, name) for name in FIELDS if name in compiled.fields}
    assert got == expected(entry, compiled.fields)
    written = unwrap(wrap(untimed)).ts
    assert e.ts == (pytest.approx(written - entry["duration_ms"] / 1000.0, abs=1e-6) if written is not None
                    else 0.0)


@settings(max_examples=200, deadline=None)
@given(entry=entries(), known=st.sampled_from(JSON_FORMATS), wrap=_WRAPS)
def test_istios_json_reads_back(entry, known, wrap):
    line = render_json(known.format, entry)
    e = read_back(wrap(line)).entry
    keys = json.loads(known.format)
    assert e.code == entry["code"] and e.flags == entry["flags"] and e.ts == pytest.approx(entry["ts"], abs=1e-6)
    assert (e.user_agent, e.upstream_host) == (entry["user_agent"], entry["upstream_host"])
    assert e.details == (entry["details"] if "response_code_details" in keys else None)


@settings(max_examples=300, deadline=None)
@given(entry=entries(), fmt=st.sampled_from(CUSTOM_TEXT + CUSTOM_JSON), wrap=_WRAPS)
def test_a_custom_format_reads_back(entry, fmt, wrap):
    compiled = compile_format(fmt)
    # A line whose format starts with a free field (an address) cannot be told from a grep or stern prefix
    # before it (is `a:b:...` a file name?): only the wrappers of a shape of their own come off such a line.
    assume(compiled.encoding == "JSON" or compiled.head is not None or wrap not in (stern, grep_hn))
    if compiled.encoding == "TEXT" and "%d/%b/%Y:%T %z" in fmt:
        entry["ts"] = int(entry["ts"])  # that spec prints whole seconds
    line = render_json(fmt, entry) if compiled.encoding == "JSON" else render_text(fmt, entry)
    read = read_back(wrap(line), compiled)
    assert read.format == "custom"
    e = read.entry
    got = {name: getattr(e, name) for name in FIELDS if name in compiled.fields}
    want = expected(entry, compiled.fields)
    if "%REQ(X-REQUEST-ID):8%" in fmt and entry["request_id"]:
        want["request_id"] = entry["request_id"][:8]
    assert got == want
    precision = 1.0 if "%START_TIME(%s)%" in fmt else 1e-3
    assert e.ts == pytest.approx(entry["ts"], abs=precision)


_OPERATORS = ["%START_TIME%", "%RESPONSE_CODE%", "%RESPONSE_FLAGS%", "%RESPONSE_CODE_DETAILS%", "%BYTES_SENT%",
              "%DURATION%", "%UPSTREAM_HOST%", "%DOWNSTREAM_REMOTE_ADDRESS%", '"%REQ(USER-AGENT)%"',
              '"%REQ(X-REQUEST-ID)%"', "%UPSTREAM_CLUSTER%", '"%UPSTREAM_TRANSPORT_FAILURE_REASON%"',
              "%REQ(:METHOD)%", "%PROTOCOL%", '"%DYNAMIC_METADATA(istio.mixer:status)%"']


@settings(max_examples=300, deadline=None)
@given(entry=entries(), ops=st.lists(st.sampled_from(_OPERATORS), min_size=1, max_size=10, unique=True),
       separator=st.sampled_from([" ", " | ", ", ", "\t"]), bracket=st.booleans())
def test_any_format_of_envoys_operators_reads_back(entry, ops, separator, bracket):
    assume({"%RESPONSE_CODE%", "%RESPONSE_FLAGS%"} & set(ops) and (bracket or "%START_TIME%" in ops))
    fmt = ("[%START_TIME%] " if bracket else "") + separator.join(ops) + "\n"
    compiled = compile_format(fmt)
    line = render_text(fmt, entry)
    e = read_back(line, compiled).entry
    got = {name: getattr(e, name) for name in FIELDS if name in compiled.fields}
    assert got == expected(entry, compiled.fields)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400) | st.binary(max_size=400).map(lambda b: b.decode("latin-1")),
       st.sampled_from([None, *(compile_format(f) for f in CUSTOM_TEXT + CUSTOM_JSON)]))
def test_random_input_never_raises(text, fmt):
    entry = parse_line(text, fmt)
    assert entry is None or isinstance(entry.code, int)


def test_a_count_no_envoy_writes_is_no_line_wrapped_or_not():
    fmt = compile_format("%START_TIME% %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_SENT%")
    line = "2026-12-03T13:40:08.211Z 503 UF " + "9" * 30  # more digits than a uint64 holds
    assert parse_line(line, fmt) is None and parse_line(kubectl_timestamps(line), fmt) is None


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from('%()?:ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789 "{}[]-'), max_size=60))
def test_random_format_strings_compile_or_say_why(fmt):
    try:
        compile_format(fmt)
    except LogFormatError as e:
        assert "\n" not in str(e)


def test_a_format_without_start_time_takes_the_wrappers_time():
    fmt = compile_format("%RESPONSE_CODE% %RESPONSE_FLAGS% %DURATION%")
    assert parse_line("503 UF 250", fmt) is None  # no time at all: the line cannot be placed among the packets
    e = parse_line(kubectl_timestamps("503 UF 250"), fmt)  # written when the request ended
    assert (e.code, e.flags, e.duration_ms) == (503, ("UF",), 250)
    assert e.ts == pytest.approx(unwrap_ts(kubectl_timestamps("x")) - 0.25, abs=1e-6)


def test_a_line_of_a_format_that_starts_with_a_time_is_not_unwrapped():
    fmt = compile_format("%START_TIME% %RESPONSE_CODE% %RESPONSE_FLAGS%")
    line = "2026-12-03T13:40:08.211Z 503 UF"  # the shape of kubectl's timestamp before a line "503 UF"
    for wrapped, names in ((line, ()), (kubectl_timestamps(line), ("kubectl-timestamps",))):
        read = read_line(wrapped, fmt)
        assert (read.entry.code, read.unwrapped.wrappers) == (503, names)


# --- lines no format reads whole ----------------------------------------------------------------------------

FULL = render_text(TEXT_FORMATS[0].format, {
    "ts": 1764769208.211, "method": "GET", "path": "/a", "protocol": "HTTP/1.1", "code": 503, "flags": ("UF",),
    "details": "upstream_reset_before_response_started{remote_connection_failure}", "bytes_received": 0,
    "bytes_sent": 91, "duration_ms": 2, "upstream_cluster": "inbound|9080||", "downstream_remote": "10.0.0.9:4000"})


def test_a_cut_short_line_is_read_in_part():
    for cut in (FULL.index(" -", 100), FULL.index("inbound|9080||") + 20):
        read = read_line(FULL[:cut])
        assert read is not None and read.format == PARTIAL
        e = read.entry
        assert (e.method, e.path, e.code, e.flags, e.details) == ("GET", "/a", 503, ("UF",), (
            "upstream_reset_before_response_started{remote_connection_failure}"))
        assert e.upstream_cluster == ("inbound|9080||" if cut > FULL.index("inbound") else None)
        assert e.downstream_remote is None and e.bytes_sent == 0  # never read from a place it might not hold


def test_a_partial_line_takes_details_only_when_shaped_so():
    old = render_text(ENVOY_DEFAULT.format, {"ts": 1764769208.211, "method": "GET", "path": "/", "code": 503,
                                            "protocol": "HTTP/1.1", "flags": ("UF",), "bytes_sent": 91})
    cut = read_line(old + " extra-field")  # Envoy's default with a field added: read in part
    assert cut.format == PARTIAL and cut.entry.details is None and cut.entry.code == 503
    assert read_line('[2026-12-03T13:40:08.211Z] "GET / HTTP/1.1" 200') is None  # no flags: too short to tell
    assert read_line('"GET / HTTP/1.1" 200') is None and read_line('"quoted" 503 UF') is None
