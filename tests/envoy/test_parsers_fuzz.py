"""Every Envoy parser on text no Envoy wrote: it returns a value or raises its one documented error.

Near-valid inputs are the reference samples with one token swapped for something that broke a parser before
(issue 15): `1e999`, thousands of digits, Unicode digits that `str.isdigit()` accepts, nesting deeper than
Python recurses, JSON of the wrong type.
"""

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.access_log import parse_line, parse_lines
from kubectl_meshdoctor.envoy.clusters import FormatError, parse_clusters, parse_clusters_json, parse_clusters_text
from kubectl_meshdoctor.envoy.flags import decode_flags, parse_reset_details, transport_errno
from kubectl_meshdoctor.envoy.logging import parse_logging
from kubectl_meshdoctor.envoy.server_info import envoy_version
from kubectl_meshdoctor.envoy.stats import cluster_failures, istio_requests, listener_failures, parse_stats

from .conftest import access_log_lines, logging_bodies, read

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DEEP = 100_000
HUGE = "9" * 5000
BREAKERS = ("1e999", "-1e999", HUGE, "-" + HUGE, "²", "٣", "1²", "NaN", "Infinity", "", "-", "0x10", "1.5",
            "[" * DEEP + "]" * DEEP, '{"a":' * 2000 + "1" + "}" * 2000, "[]", "{}", "null", "true", '"x"')
# Quoted strings, numbers and JSON literals: the tokens a mutation swaps.
_TOKEN = re.compile(r'"[^"\n]*"|-?\d+(?:\.\d+)?|\btrue\b|\bfalse\b|\bnull\b')

CLUSTERS_TEXT = read("clusters.txt")
CLUSTERS_JSON = read("clusters.json")
STATS = read("stats_sample.txt")
LOGGING = next(iter(logging_bodies().values()))
ACCESS = access_log_lines()
SERVER_INFO = json.dumps({"version": "a1b2/1.33.2/Clean/RELEASE/BoringSSL", "state": "LIVE"})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)


@st.composite
def mutated(draw, text: str) -> str:
    """`text` with one to three tokens replaced by a breaker, random text or random JSON."""
    for _ in range(draw(st.integers(1, 3))):
        tokens = list(_TOKEN.finditer(text))
        if not tokens:
            break
        m = draw(st.sampled_from(tokens))
        new = draw(st.sampled_from(BREAKERS) | st.text(max_size=30) | json_values.map(json.dumps))
        text = text[:m.start()] + new + text[m.end():]
    return text


def must_return_or_raise(parse, body, error=FormatError):
    try:
        return parse(body)
    except error:
        return None


@FUZZ
@given(st.text() | mutated(CLUSTERS_TEXT) | mutated(CLUSTERS_JSON) | json_values.map(json.dumps))
def test_clusters_returns_or_raises_format_error(body):
    for parse in (parse_clusters, parse_clusters_text, parse_clusters_json):
        must_return_or_raise(parse, body)


@FUZZ
@given(st.text() | mutated(STATS))
def test_stats_returns_or_raises_format_error(body):
    stats = must_return_or_raise(parse_stats, body)
    if stats is not None:  # what the callers do next with a snapshot must not fail either
        istio_requests(stats), cluster_failures(stats), listener_failures(stats)


@FUZZ
@given(st.text() | mutated(LOGGING))
def test_logging_returns_or_raises_format_error(body):
    must_return_or_raise(parse_logging, body)


@FUZZ
@given(st.text() | mutated(SERVER_INFO) | json_values.map(json.dumps))
def test_server_info_returns_or_raises_format_error(body):
    must_return_or_raise(envoy_version, body)


@FUZZ
@given(st.text() | st.sampled_from(ACCESS).flatmap(mutated)
       | st.sampled_from(ACCESS).map(lambda line: json.dumps(_as_json(line))).flatmap(mutated))
def test_access_log_parse_line_never_raises(line):
    entry = parse_line(line)
    if entry is not None:  # the properties callers read are computed from parsed text too
        entry.response_flags, parse_reset_details(entry.details), transport_errno(entry.upstream_failure)


def _as_json(line: str) -> dict:
    entry = parse_line(line)
    return {"start_time": "2025-06-12T08:14:01.207Z", "response_code": entry.code, "duration": entry.duration_ms,
            "response_flags": ",".join(entry.flags) or "-", "response_code_details": entry.details,
            "upstream_transport_failure_reason": entry.upstream_failure, "bytes_sent": entry.bytes_sent}


_DETAILS = "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_111}"


@FUZZ
@given(st.none() | st.text() | mutated(_DETAILS) | st.sampled_from(BREAKERS).map(
    lambda b: f"upstream_reset_before_response_started{{connection_failure,delayed_connect_error:_{b}}}"))
def test_flags_and_reset_details_never_raise(text):
    decode_flags(text)
    details = parse_reset_details(text)
    if details is not None:
        details.flag, details.reason_text, details.transport_text, details.errno
    transport_errno(text)


# Regressions: each of these raised something other than the documented error.

@pytest.mark.parametrize("value", ["1e999", HUGE, "²", "NaN"])
def test_clusters_json_field_breakers_are_format_errors(value):
    body = '{"cluster_statuses":[{"name":"c","host_statuses":[{"weight":%s,"address":{"socket_address":' \
           '{"port_value":"%s"}}}]}]}' % (value if value != "²" else '"²"', value)
    with pytest.raises(FormatError):
        parse_clusters_json(body)


@pytest.mark.parametrize("body", ["[" * DEEP + "]" * DEEP, '{"cluster_statuses":' + "[" * DEEP + "]" * DEEP + "}",
                                  '{"version":%s}' % HUGE, "[]", '"x"', "5"])
def test_deep_huge_and_non_dict_json_are_format_errors(body):
    with pytest.raises(FormatError):
        parse_clusters_json(body)
    with pytest.raises(FormatError):
        envoy_version(body)


def test_stats_keeps_digits_no_counter_holds_as_text():
    stats = parse_stats(f"a.b: {HUGE}\nc.d: ²\ne.f: 1e999\ng.h: 7\n")
    assert stats == {"a.b": HUGE, "c.d": "²", "e.f": "1e999", "g.h": 7}


def test_istio_requests_with_a_unicode_digit_code_is_skipped():
    stats = parse_stats("reporter=.=source;.;response_code=.=²;.;response_flags=.=UC;.;_istio_requests_total: 3"
                        "\nistiocustom.istio_requests_total.reporter.source.response_code."
                        f"{HUGE}.x.response_flags.UC.: 1")
    assert istio_requests(stats) == {}


@pytest.mark.parametrize("value", ["²", HUGE, "1e999"])
def test_transport_errno_of_a_breaker_is_none(value):
    assert transport_errno(f"delayed_connect_error:_{value}") is None
    assert transport_errno("delayed_connect_error:_111") == 111


@pytest.mark.parametrize("line", ['{"start_time":"2025-06-12T08:14:01Z","response_code":%s}' % HUGE,
                                  '{"start_time":"2025-06-12T08:14:01Z","response_code":1e999}',
                                  '{"start_time":"2025-06-12T08:14:01Z","response_code":"²"}',
                                  "{" + '"a":[' * DEEP, "[" * DEEP])
def test_access_log_breakers_are_not_entries(line):
    assert parse_line(line) is None


def test_one_bad_access_log_line_drops_only_itself():
    bad = '{"start_time":"2025-06-12T08:14:01Z","response_code":1e999}'
    assert parse_lines("\n".join([ACCESS[0], bad, ACCESS[1]])) == [parse_line(ACCESS[0]), parse_line(ACCESS[1])]
