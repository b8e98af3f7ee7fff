import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.flags import (
    AFTER_RESPONSE,
    BEFORE_RESPONSE,
    RESET_BY_TOKEN,
    RESET_REASONS,
    RESPONSE_FLAGS,
    decode_flags,
    encode_flags,
    flag,
    parse_reset_details,
    parse_response_code_details,
    transport_errno,
)

from .conftest import read


def _table(section: str) -> list[list[str]]:
    """Rows of the first markdown table after `section` in response_flags.md (header and rule dropped)."""
    text = read("response_flags.md").split(section, 1)[1]
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def test_every_flag_of_the_reference_is_known_with_its_names_protocols_and_status():
    rows = _table("## 1. Flags")
    assert len(rows) == 30 == len(RESPONSE_FLAGS)
    for (index, short, long, proto, status, meaning), ours in zip(rows, RESPONSE_FLAGS):
        assert (ours.index, ours.short, ours.long, ours.typical_status) == (int(index), short, long, status)
        assert ours.protocols == tuple(proto.split("+"))
        assert ours.meaning and ours.known
        assert flag(short) is ours and flag(long) is ours  # %RESPONSE_FLAGS_LONG% decodes too


def test_decode_keeps_order_and_unknown_flags():
    assert [f.short for f in decode_flags("URX,UF")] == ["URX", "UF"]
    assert [f.short for f in decode_flags("UF,URX")] == ["UF", "URX"]  # pre-1.29 enum order
    assert decode_flags("-") == decode_flags("") == decode_flags(None) == ()
    custom = decode_flags("UC,XYZ")
    assert [f.short for f in custom] == ["UC", "XYZ"]
    assert custom[0].long == "UpstreamConnectionTermination" and custom[0].typical_status == "503"
    assert not custom[1].known and custom[1].long == "" and custom[1].index == 0
    assert decode_flags("UpstreamRetryLimitExceeded,UpstreamConnectionFailure") == decode_flags("URX,UF")
    assert {f.short for f in decode_flags("UH")} == {"UH"} and flag("UH").protocols == ("HTTP", "TCP")


def test_encode():
    assert encode_flags(()) == "-"
    assert encode_flags(decode_flags("URX,UF")) == "URX,UF"
    assert encode_flags(["UC"]) == "UC"


_SHORT = st.sampled_from([f.short for f in RESPONSE_FLAGS]) | st.from_regex(r"[A-Z]{2,6}", fullmatch=True)


@given(st.lists(_SHORT, max_size=5))
def test_encode_decode_round_trip(names):
    text = encode_flags(names)
    assert [f.short for f in decode_flags(text)] == names
    assert encode_flags(decode_flags(text)) == text


def test_reset_reason_table_matches_the_reference():
    rows = _table("## 2. Upstream reset reasons")
    assert len(rows) == 12
    for text, token, short, status in rows:
        reason = RESET_BY_TOKEN[token.strip("`")]
        assert (reason.text, reason.flag, reason.status) == (text, short, int(status.split()[0]))
    # plus the pre-split generic spelling of the 2022 logs
    assert RESET_BY_TOKEN["connection_failure"].flag == "UF"
    assert len(RESET_REASONS) == 13


@pytest.mark.parametrize("details, reason, transport, errno", [
    # 2025+ / Envoy 1.33: '|' and strerror text
    ("upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
     "remote_connection_failure", "delayed_connect_error:_Connection_refused", 111),
    # 2024: ',' and errno
    ("upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_111}",
     "remote_connection_failure", "delayed_connect_error:_111", 111),
    # 2022 - early 2023: generic connection_failure
    ("upstream_reset_before_response_started{connection_failure,delayed_connect_error:_111}",
     "connection_failure", "delayed_connect_error:_111", 111),
    ("upstream_reset_before_response_started{connection_failure}", "connection_failure", "", None),
])
def test_connect_failure_details_in_every_version_spelling(details, reason, transport, errno):
    parsed = parse_response_code_details(details)
    assert parsed is not None
    assert (parsed.phase, parsed.reason, parsed.transport) == (BEFORE_RESPONSE, reason, transport)
    assert parsed.flag == "UF" and parsed.is_connect_failure and parsed.errno == errno
    assert parsed.raw == details


def test_tls_transport_detail_keeps_its_pipes():
    details = ("upstream_reset_before_response_started{remote_connection_failure|TLS_error:|268435703:SSL_routines:"
               "OPENSSL_internal:WRONG_VERSION_NUMBER:TLS_error_end}")
    parsed = parse_reset_details(details)
    assert parsed.reason == "remote_connection_failure" and parsed.flag == "UF"
    assert parsed.transport == "TLS_error:|268435703:SSL_routines:OPENSSL_internal:WRONG_VERSION_NUMBER:TLS_error_end"
    assert parsed.errno is None


@pytest.mark.parametrize("token, short", [(r.token, r.flag) for r in RESET_REASONS])
def test_every_reset_token_maps_to_its_flag(token, short):
    for phase in (BEFORE_RESPONSE, AFTER_RESPONSE):
        parsed = parse_reset_details(f"upstream_reset_{phase}{{{token}}}")
        assert (parsed.phase, parsed.reason, parsed.transport, parsed.flag) == (phase, token, "", short)
        assert parsed.reason_text == RESET_BY_TOKEN[token].text


def test_other_details_are_not_resets():
    for details in ("via_upstream", "response_timeout", "filter_chain_not_found", "-", "", None,
                    "downstream_local_disconnect(filter_chain_is_being_removed)",
                    "upstream_reset_before_response_started"):
        assert parse_reset_details(details) is None
    odd = parse_reset_details("upstream_reset_before_response_started{some_future_reason}")
    assert odd.reason == "some_future_reason" and odd.flag is None and odd.reason_text == "some future reason"


def test_transport_errno_spellings():
    assert transport_errno("delayed_connect_error:_Connection_refused") == 111
    # Envoy 1.40 appends the address it dialled (seen in the lab's port-exhaustion pod).
    assert transport_errno("immediate_connect_error:_Cannot_assign_requested_address|"
                           "remote_address:198.18.1.2:5000") == 99
    assert transport_errno("delayed connect error: 111") == 111
    assert transport_errno("delayed_connect_error:_No_route_to_host") == 113
    assert transport_errno("-") is None and transport_errno(None) is None


def test_details_of_the_reference_body_sizes_match_the_reset_text():
    # response_flags.md: the local reply body is "...reset reason: <text>" and its length is BYTES_SENT.
    prefix = "upstream connect error or disconnect/reset before headers. reset reason: "
    for token, size in (("connection_termination", 95), ("protocol_error", 87), ("overflow", 81)):
        assert len(prefix + RESET_BY_TOKEN[token].text) == size
    uf = parse_reset_details(
        "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}")
    text = f"{prefix}{uf.reason_text}, transport failure reason: {uf.transport_text}"
    assert len(text) == 167
