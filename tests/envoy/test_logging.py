import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.clusters import FormatError
from kubectl_meshdoctor.envoy.logging import (
    ISTIO_DEFAULT_LEVEL,
    LEVELS,
    LevelError,
    istio_defaults,
    log_level_queries,
    logging_error,
    parse_level_spec,
    parse_logging,
)

from .conftest import logging_bodies, read

LOGGERS_IN_ENUM_ORDER = (
    "admin alternate_protocols_cache aws assert backtrace basic_auth cache_filter client config connection "
    "conn_handler decompression dns dubbo envoy_bug ext_authz ext_proc rocketmq file filter forward_proxy "
    "geolocation grpc happy_eyeballs hc health_checker http http2 hystrix init io jwt kafka key_value_store lua "
    "main matcher misc mongo multi_connection oauth2 quic quic_stream pool rate_limit_quota rbac rds redis router "
    "runtime stats secret tap testing thrift tracing upstream udp wasm websocket golang").split()

BODIES = logging_bodies()


def body(prefix: str) -> str:
    (match,) = [b for title, b in BODIES.items() if title.startswith(prefix)]
    return match


@pytest.fixture(scope="module")
def loggers():
    return list(parse_logging(body("POST /logging  (no query")))


def test_all_sections_of_the_reference_were_found():
    assert len(BODIES) == 9


def test_list_body_has_61_loggers_in_enum_order_with_istio_defaults():
    """The recorded body of an older Envoy build (61 loggers; the lab's Envoy 1.40 has 73, test_real_envoy.py)."""
    loggers = parse_logging(body("POST /logging  (no query"))
    assert len(LOGGERS_IN_ENUM_ORDER) == 61
    assert list(loggers) == LOGGERS_IN_ENUM_ORDER
    assert loggers == {name: "error" if name == "misc" else "warning" for name in LOGGERS_IN_ENUM_ORDER}
    assert loggers == istio_defaults(LOGGERS_IN_ENUM_ORDER)


def test_changed_level_bodies():
    assert set(parse_logging(body("POST /logging?level=debug")).values()) == {"debug"}
    single = parse_logging(body("POST /logging?http=trace"))
    assert single["http"] == "trace" and single["misc"] == "error" and single["http2"] == "warning"
    multi = parse_logging(body("POST /logging?paths=connection:debug,http:trace"))
    assert (multi["connection"], multi["http"], multi["conn_handler"]) == ("debug", "trace", "warning")
    for changed in (single, multi):
        assert list(changed) == LOGGERS_IN_ENUM_ORDER


@pytest.mark.parametrize("prefix, error", [
    ("POST /logging?connection=debug&http=trace", "invalid number of parameters"),
    ("POST /logging?paths=conn:debug", "unknown logger name"),
    ("POST /logging?level=verbose", "unknown logger level"),
    ("POST /logging?level=info&paths", "invalid number of parameters"),
])
def test_rejected_requests_still_list_the_unchanged_loggers(prefix, error):
    text = body(prefix)
    assert logging_error(text) == error
    assert parse_logging(text) == istio_defaults(LOGGERS_IN_ENUM_ORDER)  # nothing changed, http not trace


def test_usage_text_lists_exactly_our_levels():
    levels_line = next(line for line in body("POST /logging?level=verbose").splitlines() if line.startswith("levels:"))
    assert tuple(levels_line.split()[1:]) == LEVELS
    assert logging_error(body("POST /logging  (no query")) is None


def test_get_405_is_not_a_logging_body():
    with pytest.raises(FormatError) as info:
        parse_logging(body("GET /logging"))
    assert "\n" not in str(info.value)
    with pytest.raises(FormatError):
        parse_logging("<html></html>")


def test_fine_grain_logging_lists_files():
    text = ("active loggers:\n  source/common/http/conn_manager_impl.cc: warning\n"
            "  source/common/router/router.cc: debug\n")
    assert parse_logging(text) == {"source/common/http/conn_manager_impl.cc": "warning",
                                   "source/common/router/router.cc": "debug"}


def test_queries_like_istioctl(loggers):
    assert log_level_queries("debug", loggers) == ("level=debug",)
    assert log_level_queries("http:debug,connection:trace", loggers) == ("http=debug", "connection=trace")
    assert log_level_queries("http=debug,connection=trace", loggers) == ("http=debug", "connection=trace")
    assert log_level_queries("connection:debug,http:trace", loggers, use_paths=True) == \
        ("paths=connection:debug,http:trace",)
    # a bare level goes first so it cannot undo the named ones
    assert log_level_queries("http:trace,info", loggers) == ("level=info", "http=trace")
    assert log_level_queries(" http2 : debug ", loggers) == ("http2=debug",)
    assert log_level_queries("http:Debug", loggers) == ("http=debug",)


def test_reset_to_istio_defaults(loggers):
    assert ISTIO_DEFAULT_LEVEL == "warning"
    assert log_level_queries("reset", loggers) == ("level=warning", "misc=error")
    assert log_level_queries("reset", loggers, use_paths=True) == ("level=warning", "paths=misc:error")
    assert log_level_queries("reset", ["admin", "http"]) == ("level=warning",)  # a build without misc
    assert log_level_queries("reset") == ("level=warning", "misc=error")


@pytest.mark.parametrize("spec", ["verbose", "warn", "http:warn", "http:", "connection=loud", ""])
def test_bad_levels_name_the_valid_ones(spec, loggers):
    with pytest.raises(LevelError) as info:
        log_level_queries(spec, loggers)
    message = str(info.value)
    assert "\n" not in message and "trace, debug, info, warning, error, critical, off" in message
    if "warn" in spec and "warning" not in spec:
        assert "Envoy spells it 'warning'" in message


def test_unknown_logger_names_the_valid_ones(loggers):
    with pytest.raises(LevelError) as info:
        log_level_queries("conn:debug,http:trace", loggers)
    message = str(info.value)
    assert "\n" not in message and "'conn'" in message
    assert "did you mean" in message and "connection" in message
    assert "admin, alternate_protocols_cache, aws" in message and message.endswith("websocket, golang")
    # validation happens before anything is built: no partial result
    with pytest.raises(LevelError):
        parse_level_spec("http:trace,nope:debug", loggers)
    assert isinstance(info.value, ValueError)


def test_without_a_logger_list_names_are_not_checked():
    assert log_level_queries("anything:debug") == ("anything=debug",)


@given(st.lists(st.tuples(st.sampled_from(LOGGERS_IN_ENUM_ORDER), st.sampled_from(LEVELS)), min_size=1, max_size=6),
       st.sampled_from([":", "="]))
def test_spec_round_trip(pairs, sep):
    spec = ",".join(f"{name}{sep}{level}" for name, level in pairs)
    assert parse_level_spec(spec, LOGGERS_IN_ENUM_ORDER) == tuple(pairs)
    assert log_level_queries(spec, LOGGERS_IN_ENUM_ORDER) == tuple(f"{n}={lvl}" for n, lvl in pairs)


def test_reference_file_is_the_copy_with_its_sources():
    assert "envoyproxy/envoy source/server/admin/logs_handler.cc" in read("logging.txt")
