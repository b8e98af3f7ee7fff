"""What tools wrap around a log line comes off again (envoy/wrappers.py), in any nesting, and nothing of the lines
Envoy and Istio write themselves is ever taken for a wrapper. Each wrapper is built here the way its tool builds
it (the source is named at each builder); property tests nest them at random."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.envoy.wrappers import Unwrapped, rfc3339, unwrap

from .conftest import access_log_lines

TEXT = access_log_lines()[2]  # Istio's TEXT format, 503 URX,UF
JSON_LINE = ('{"start_time":"2026-12-03T13:40:08.211Z","response_code":503,"response_flags":"UF",'
             '"user_agent":"curl/8 \\"q\\""}')
# Envoy's own lines: its default log format, and Istio's (timestamp TAB level TAB ...), pilot-agent's (real
# Envoy 1.40's debug log has each of these shapes).
ENVOY_OWN = ("[2026-12-03 13:40:08.211][12][debug][router] [source/common/router/router.cc:1234] [Tags: "
             "\"ConnectionId\":\"11\"] upstream reset",
             "2026-12-03T13:40:08.210633Z\tdebug\tenvoy router external/envoy/source/common/router/router.cc:1234\t"
             "[Tags: \"ConnectionId\":\"11\",\"StreamId\":\"3298\"] upstream reset: reset reason: connection "
             "termination\tthread=24",
             "2026-12-03T13:40:08.210633Z\tinfo\tpilot-agent\tReadiness succeeded in 1.2s",
             # The continuation lines of a multi-line debug message (a header map dumped, Istio's message end).
             "':status', '503'", "'content-type', 'text/plain; charset=UTF-8'", "\tthread=24")
KUBELET_TS = "2026-12-03T13:40:08.212345678Z"
TS = datetime(2026, 12, 3, 13, 40, 8, tzinfo=timezone.utc).timestamp() + 0.212345678


# --- each tool's wrapper, as that tool writes it -------------------------------------------------------------

def kubectl_timestamps(line: str) -> str:  # the kubelet's RFC3339Nano time, one space (PodLogOptions.Timestamps)
    return f"{KUBELET_TS} {line}"


def kubectl_prefix(line: str, pod: str = "reviews-v1-7d9f8", container: str = "istio-proxy") -> str:
    return f"[pod/{pod}/{container}] {line}"  # kubectl logs.go addPrefixIfNeeded


def stern(line: str, colour: bool = False, namespace: str | None = None) -> str:
    # stern cmd/cmd.go: "{{.PodName}} {{.ContainerName}} {{.Message}}", colours by fatih/color on a terminal
    pod, container = ("\x1b[31mreviews-v1-7d9f8\x1b[0m", "\x1b[32mistio-proxy\x1b[0m") if colour else \
        ("reviews-v1-7d9f8", "istio-proxy")
    return f"{namespace + ' ' if namespace else ''}{pod} {container} {line}"


def stern_timestamps(line: str) -> str:  # stern --timestamps: RFC3339Nano in the local zone
    return f"2026-12-03T14:40:08.212345678+01:00 {line}"


def docker_json(line: str) -> str:  # moby jsonfilelog: one JSON object a line, log with its newline
    return json.dumps({"log": line + "\n", "stream": "stdout", "time": KUBELET_TS}, separators=(",", ":"))


def cri(line: str, tag: str = "F") -> str:  # the kubelet's CRI log file
    return f"{KUBELET_TS} stdout {tag} {line}"


def grep_n(line: str, n: int = 1234, sep: str = ":") -> str:
    return f"{n}{sep}{line}"


def grep_h(line: str, name: str = "/var/log/pods/shop_reviews-v1_9f2/istio-proxy/0.log", sep: str = ":") -> str:
    return f"{name}{sep}{line}"


def grep_hn(line: str, name: str = "proxy-2026-12-03.log", n: int = 77, sep: str = ":") -> str:
    return f"{name}{sep}{n}{sep}{line}"


def json_string(line: str) -> str:
    return json.dumps(line)


def json_escaped(line: str) -> str:
    return json.dumps(line)[1:-1]


@pytest.mark.parametrize("wrapped, names", [
    (kubectl_timestamps(TEXT), ("kubectl-timestamps",)),
    (kubectl_prefix(TEXT), ("kubectl-prefix",)),
    (kubectl_prefix(kubectl_timestamps(TEXT)), ("kubectl-prefix", "kubectl-timestamps")),
    (grep_n(kubectl_prefix(kubectl_timestamps(TEXT))), ("grep-n", "kubectl-prefix", "kubectl-timestamps")),
    (stern(TEXT), ("stern",)),
    (stern(TEXT, namespace="shop"), ("stern",)),
    (stern(TEXT, colour=True), ("ansi", "stern")),
    (stern(stern_timestamps(TEXT)), ("stern", "stern-timestamps")),
    (stern("01-02 15:04:05 " + TEXT), ("stern", "stern-timestamps")),
    (docker_json(TEXT), ("docker-json",)),
    (cri(TEXT), ("cri",)),
    (grep_h(cri(TEXT)), ("grep-H", "cri")),
    (grep_hn(TEXT), ("grep-Hn",)),
    (grep_hn(TEXT, sep="-"), ("grep-Hn",)),  # a context line of grep -C
    (grep_n(TEXT, sep="-"), ("grep-n",)),
    (grep_h(TEXT, name="a:b-c.log"), ("grep-H",)),
    (json_string(TEXT), ("json-string",)),
    (json_escaped(TEXT), ("json-escaped",)),
    (grep_n(json_escaped(TEXT)), ("grep-n", "json-escaped")),
    (grep_h(docker_json(TEXT)), ("grep-H", "docker-json")),
])
def test_each_wrapper_comes_off(wrapped, names):
    u = unwrap(wrapped)
    assert (u.text, u.wrappers) == (TEXT, names)


def test_a_json_line_escaped():
    for wrapped, names in ((json_escaped(JSON_LINE), ("json-escaped",)), (json_string(JSON_LINE), ("json-string",)),
                           (grep_n(json_escaped(JSON_LINE)), ("grep-n", "json-escaped"))):
        assert (unwrap(wrapped).text, unwrap(wrapped).wrappers) == (JSON_LINE, names)


def test_what_the_wrappers_carry():
    u = unwrap(grep_n(kubectl_prefix(kubectl_timestamps(TEXT), "ratings-v2-x", "istio-proxy")))
    assert (u.pod, u.container) == ("ratings-v2-x", "istio-proxy") and u.ts == pytest.approx(TS, abs=1e-6)
    assert (unwrap(stern(TEXT)).pod, unwrap(stern(TEXT)).container) == ("reviews-v1-7d9f8", "istio-proxy")
    assert unwrap(stern(stern_timestamps(TEXT))).ts == pytest.approx(TS, abs=1e-6)  # +01:00 is the same instant
    assert unwrap(docker_json(TEXT)).ts == pytest.approx(TS, abs=1e-6) and unwrap(cri(TEXT)).ts == unwrap(
        docker_json(TEXT)).ts
    assert unwrap(grep_h(TEXT)).pod is None  # a file name is never a pod
    assert unwrap(kubectl_prefix(TEXT, container="")).container is None


def test_grep_n_over_grep_h():
    u = unwrap(grep_n(grep_h(TEXT), 9))
    assert (u.text, u.wrappers) == (TEXT, ("grep-n", "grep-H"))


def test_pieces_of_a_split_line_are_marked():
    assert unwrap(cri(TEXT[:50], "P")).partial and unwrap(cri(TEXT[:50], "P")).text == TEXT[:50]
    piece = json.dumps({"log": TEXT[:50], "stream": "stdout", "time": KUBELET_TS})
    assert unwrap(piece).partial and unwrap(piece).wrappers == ("docker-partial",)
    assert not unwrap(cri(TEXT)).partial


@pytest.mark.parametrize("line", [TEXT, JSON_LINE, *ENVOY_OWN, "", "-", "hello world", "12:34 something else",
                                  '{"log":"x","level":"info"}', '"unterminated', "[pod/x"])
def test_lines_without_a_wrapper_come_back_whole(line):
    assert unwrap(line) == Unwrapped(line)


@pytest.mark.parametrize("line", [*ENVOY_OWN, JSON_LINE])
def test_envoys_own_lines_lose_only_their_wrappers(line):
    for wrapped in (kubectl_timestamps(line), kubectl_prefix(kubectl_timestamps(line)), cri(line), stern(line),
                    grep_n(line), grep_hn(line), docker_json(line)):
        assert unwrap(wrapped).text == line, wrapped


def test_rfc3339():
    assert rfc3339("2026-12-03T13:40:08Z") == datetime(2026, 12, 3, 13, 40, 8, tzinfo=timezone.utc).timestamp()
    assert rfc3339("2026-12-03T14:40:08.5+01:00") == rfc3339("2026-12-03T13:40:08.5Z")
    assert rfc3339("2026-13-03T13:40:08Z") is None and rfc3339("yesterday") is None


# --- any nesting -------------------------------------------------------------------------------------------

# How a line reaches the user: from a node's log file (CRI, Docker), through kubectl (its timestamps and prefix
# over the stream the kubelet serves) or through stern (which always asks for the kubelet's times and prints
# its own); grep and JSON over any of those.
_SOURCES = [
    [], [("cri", cri)], [("docker-json", docker_json)], [("kubectl-timestamps", kubectl_timestamps)],
    [("kubectl-prefix", kubectl_prefix)], [("kubectl-timestamps", kubectl_timestamps), ("kubectl-prefix", kubectl_prefix)],
    [("stern", stern)], [("stern-timestamps", stern_timestamps), ("stern", stern)],
    [("ansi", lambda line: stern(line, colour=True))],
]
_OUTER = [("grep-n", grep_n), ("grep-H", grep_h), ("grep-Hn", grep_hn), ("json-string", json_string)]
# One grep over what the tools wrote: a grep's prefix is taken off when what follows starts as a log line or as one
# more wrapper does, so grep over grep is read one level deep (test_grep_n_over_grep_h).
_GREPS = ("grep-n", "grep-H", "grep-Hn")


@settings(max_examples=300, deadline=None)
@given(line=st.sampled_from([TEXT, JSON_LINE, *ENVOY_OWN, *access_log_lines()]), source=st.sampled_from(_SOURCES),
       outer=st.lists(st.sampled_from(_OUTER), max_size=2, unique_by=lambda w: w[0]))
def test_any_nesting_comes_off_whole(line, source, outer):
    if sum(name in _GREPS for name, _ in outer) > 1:
        return
    wrapped, names = line, []
    for name, wrap in [*source, *outer]:
        wrapped = wrap(wrapped)
        names[:0] = ["stern"] if name == "ansi" else [name]
    names[:0] = ["ansi"] if any(name == "ansi" for name, _ in source) else []  # colours come off the whole line
    if names[:2] == ["grep-H", "grep-n"]:
        names[:2] = ["grep-Hn"]  # grep -H over grep -n's output has grep -Hn's shape: read as one
    if "json-string" in names and names[0] != "json-string":
        return  # grep over a JSON string: a line of JSON text, not one a tool writes
    u = unwrap(wrapped)
    assert u.text == line and u.wrappers == tuple(names), (wrapped, u)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_random_input_never_raises(text):
    u = unwrap(text)
    assert isinstance(u.text, str) and len(u.wrappers) <= 8
