"""A watch of several pods (deploy/x, -l) reports them as one: nothing a single pod's report holds is lost."""

from __future__ import annotations

from kubernetes.client import V1ObjectMeta, V1Pod

from kubectl_meshdoctor.commands.watch.live import merge_reports
from kubectl_meshdoctor.core.findings import Problem
from kubectl_meshdoctor.core.pipeline import IfaceStats, PipelineStats
from kubectl_meshdoctor.kube.client import KubeError
from kubectl_meshdoctor.core.report_model import KernelSide, LiveSource, LogLinesRead, Report, SidecarSide


def pod_report(name: str, packets: int) -> Report:
    stats = PipelineStats(packets=packets, by_iface={"lo": IfaceStats(packets=packets)},
                          frames_read={"lo": packets * 3})
    return Report(LiveSource((name,), "shop"), stats, [],
                  [Problem(f"pod/{name} lo", "tcpdump: 1 packets dropped by kernel")],
                  envoy=SidecarSide("1.40.0", {"inbound|5000||": {"upstream_cx_connect_fail": 1}},
                                    LogLinesRead(access_log_lines=packets)),
                  kernel=KernelSide({"TcpOutRsts": packets}))


def test_every_pod_keeps_its_envoy_side_frames_and_counters():
    pods = [V1Pod(metadata=V1ObjectMeta(name=n)) for n in ("web-1", "web-2", "web-3")]
    merged = merge_reports(pods, [pod_report("web-1", 10), pod_report("web-2", 4), KubeError("exec refused")])
    d = merged.to_dict()
    assert d["stats"]["packets"] == 14
    assert d["stats"]["frames_read"] == {"web-1/lo": 30, "web-2/lo": 12}
    assert d["stats"]["interfaces"] == {"web-1/lo": {"packets": 10}, "web-2/lo": {"packets": 4}}
    assert sorted(d["envoy"]["per_pod"]) == ["web-1", "web-2"]
    assert d["envoy"]["per_pod"]["web-2"]["access_log_lines"] == 4
    assert d["kernel"] == {"web-1/TcpOutRsts": 10, "web-2/TcpOutRsts": 4}
    assert [p["where"] for p in d["problems"]] == ["pod/web-1 lo", "pod/web-2 lo", "pod/web-3"]
    assert d["source"]["pods"] == ["web-1", "web-2"]
