"""Redaction judged as Envoy reads a header (case-insensitive names, non-token names distrusted, obs-fold lines
belonging to the field above) and tokens in request targets (issue 15)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kubectl_meshdoctor.core.redact import (REDACTED, SENSITIVE_HEADERS, SENSITIVE_QUERY_PARAMS, header_line,
                                            raw_line, redact_target)
from kubectl_meshdoctor.sources.http1 import parse_http_start
from kubectl_meshdoctor_plugins.http_framing import framing_violations

SECRET = "zQ9xSecretValue"
decoration = st.text(alphabet="\x00 \t\x0b\x0c", max_size=3)
spelling = st.sampled_from(sorted(SENSITIVE_HEADERS)).flatmap(
    lambda n: st.tuples(*(st.sampled_from([c.lower(), c.upper()]) for c in n)).map("".join))


@given(spelling, decoration, decoration, st.sampled_from([": ", ":", " : ", ":\t"]))
def test_a_sensitive_name_in_any_case_and_decoration_never_shows_its_value(name, before, after, colon):
    decorated = before + name + after
    line = f"{decorated}{colon}{SECRET}"
    assert SECRET not in header_line(decorated, SECRET)
    assert SECRET not in raw_line(line)
    msg = parse_http_start(f"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n{line}\r\n\r\n".encode())
    assert all(SECRET not in p for p in framing_violations(msg))
    assert any(SECRET in p for p in framing_violations(msg, redact=False)) or SECRET in str(msg.headers)


def test_a_folded_continuation_is_hidden_with_its_field_and_shown_with_others():
    msg = parse_http_start(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"
                           b"Cookie: a=1;\r\n b=" + SECRET.encode() + b"\r\n\tc=" + SECRET.encode()
                           + b"\r\nX-Note: long\r\n  and folded\r\n\r\n")
    problems = framing_violations(msg)
    assert all(SECRET not in p for p in problems) and any("and folded" in p for p in problems)
    assert sum(SECRET in p for p in framing_violations(msg, redact=False)) == 2


@pytest.mark.parametrize("eol", ["\n", "\r", "\r\n"])
@pytest.mark.parametrize("name", ["Authorization", "Proxy-Authorization", "Cookie"])
def test_a_folded_line_holding_a_bare_line_end_hides_what_follows_it(eol, name):
    """Issue 29, item 3: a parser that takes a bare LF (or CR) for a line end reads what follows it in an obs-fold
    line as the next header: a continuation is cut there, as a plain header line is."""
    line = f"  and folded{eol}{name}: Bearer {SECRET}"
    shown = raw_line(line, owner="X-Note")
    assert SECRET not in shown and shown.startswith("  and folded") and REDACTED in shown
    msg = parse_http_start(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\nX-Note: long\r\n"
                           + line.encode() + b"\r\n\r\n")
    assert all(SECRET not in p for p in framing_violations(msg))


def test_a_continuation_with_nothing_above_it_is_hidden():
    assert raw_line(" " + SECRET) == " " + REDACTED and raw_line(" " + SECRET, owner="") == " " + REDACTED


def test_a_name_that_is_not_a_token_shows_every_byte_of_its_name_and_none_of_its_value():
    assert raw_line(f"Authorization\x00: Bearer {SECRET}") == f"Authorization\x00: {REDACTED}"
    assert raw_line(f"X-Bad : {SECRET}") == f"X-Bad : {REDACTED}"  # issue 32: the space before the colon shown
    assert raw_line(f"X-Foo\nCookie: {SECRET}") == "X-Foo\n" + REDACTED
    assert raw_line(f"Cookie sid={SECRET}") == "Cookie " + REDACTED
    assert header_line("X-Trace", "abc") == "X-Trace: abc"
    assert raw_line(f"Cookie sid={SECRET}", redact=False) == f"Cookie sid={SECRET}"


param = st.sampled_from(sorted(SENSITIVE_QUERY_PARAMS)).flatmap(
    lambda n: st.tuples(*(st.sampled_from([c.lower(), c.upper()]) for c in n)).map("".join))
value = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="&# \t\r\n\x0b\x0c"
                                       "\x1c\x1d\x1e\x1f\x85\xa0"), min_size=1).filter(lambda v: not v.isspace())


@example("key", "+%", "?", False)  # an unencoded nested name: its own value is hidden, not its host's
@given(param, value, st.sampled_from(["?", "&", ";", "#"]), st.booleans())
def test_credential_query_values_never_show_and_their_names_stay(name, v, sep, quoted):
    target = f"/cb?x=1{sep}{name}={v}&next=/home"
    shown = f"GET {target} HTTP/1.1"
    shown = repr(shown) if quoted else shown
    out = redact_target(shown)
    assert f"{name}={REDACTED}" in out and "next=/home" in out and "x=1" in out
    if len(v) > 3:
        assert v not in out
    assert redact_target(shown, redact=False) == shown


def test_percent_encoded_names_and_other_parameters():
    assert redact_target("/a?access%5Ftoken=s3&page=2") == f"/a?access%5Ftoken={REDACTED}&page=2"
    assert redact_target("/a?tokens=1&monkey=2") == "/a?tokens=1&monkey=2"
    assert redact_target("no query here: a=b") == "no query here: a=b"


@pytest.mark.parametrize("target", ["/login?redirect_uri=https%3A%2F%2Fx%2Fcb%3Fcode%3DS3CR3T&a=1",
                                    "/x?next=/y%3Ftoken%3DS3CR3T", "/x?next=%252Fcb%253Faccess_token%253DS3CR3T",
                                    "/x?state=1&return=%2Fa%3Fb%3D1%26api_key%3DS3CR3T"])
def test_a_credential_inside_a_percent_encoded_value_is_hidden(target):
    shown = redact_target(f"GET {target} HTTP/1.1")
    assert "S3CR3T" not in shown and "<redacted>" in shown
    assert redact_target(f"GET {target} HTTP/1.1", redact=False).count("S3CR3T") == 1


def test_an_encoded_value_without_credentials_stays_readable():
    assert redact_target("/x?next=/y%3Fpage%3D2&q=a+b") == "/x?next=/y%3Fpage%3D2&q=a+b"
