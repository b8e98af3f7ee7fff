"""core/hop_path.flags_logger: whose sidecar's access log carries a finding's response flags (issue 32 item 11),
from the finding alone, whatever its detector. Envoy sets an upstream flag on the line of the sidecar whose upstream
failed (Envoy's access-log response flags, usage.rst): on eth0 that is the connection's client."""

from __future__ import annotations

from pathlib import Path

from kubectl_meshdoctor.core.findings import COUNTER, Finding, FlowRef, NoFlow, Severity
from kubectl_meshdoctor.core.hop_path import flags_logger, quotes_flags

DATA = Path(__file__).parent.parent / "data"
CALLER_UC = next(line for line in (DATA / "envoy-1.40-mesh" / "downstream-idle" / "caller" / "istio-proxy.log")
                 .read_text().splitlines() if '" 503 UC ' in line)


def finding(flow, flags=("UC", "UF", "URX"), **details) -> Finding:
    return Finding("any-detector", Severity.ERROR, "t", flow, (), envoy_flags=flags, details=details)


EAST = FlowRef("198.18.1.1:40811", "198.18.1.2:5002", "eth0")


def test_an_upstream_flag_of_a_connection_the_pod_accepted_is_the_callers():
    for f in (finding(EAST, end="server"), finding(EAST)):  # the pod's end said, or not known
        logger = flags_logger(f)
        assert logger is not None and logger.caller_ip == "198.18.1.1"
        assert logger.text() == ("UC, UF, URX are logged by the caller's sidecar at 198.18.1.1 (it opened this "
                                 "connection; a caller without a sidecar logs none), not by this pod's")
    v6 = flags_logger(finding(FlowRef("[fd00::1]:40811", "[fd00::2]:5002", "eth0"), end="server"))
    assert v6.caller_ip == "fd00::1"


def test_the_pods_own_sidecar_logs_the_rest():
    own = [finding(EAST, end="client"),  # the pod opened it: its own upstream
           finding(EAST, flags=("DC",)),  # a downstream flag: the accepting sidecar's
           finding(FlowRef("127.0.0.6:51544", "198.18.1.2:5000", "lo"), flags=("UC",)),
           finding(FlowRef("-", "198.18.1.2:5000", ""), flags=("UF",)),
           finding(NoFlow(COUNTER, "inbound|5000||"), flags=("UO",))]
    for f in own:
        logger = flags_logger(f)
        assert logger is not None and logger.caller_ip == "" and logger.text().endswith("logged by this pod's sidecar")
    assert flags_logger(finding(EAST, flags=())) is None


def test_quotes_flags_reads_the_quoted_lines():
    assert not quotes_flags(finding(EAST))
    quoted = Finding("d", Severity.ERROR, "t", EAST, (), envoy_flags=("UC", "UF"), access_log=(CALLER_UC,))
    assert quotes_flags(quoted)
    assert not quotes_flags(Finding("d", Severity.ERROR, "t", EAST, (), envoy_flags=("UPE",), access_log=(CALLER_UC,)))
