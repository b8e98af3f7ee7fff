"""Printed fixes (core/fixes.py) and how the lab turns one into a pod (lab/fixes.py), without the lab: the text a
finding prints is rendered from the fixes it carries, and a fix's annotations become the rules, Envoy settings
and Pod object Istio would make of them. tests/lab/test_fixes.py proves each fix removes its failure."""

from __future__ import annotations

import pytest

from meshdoctor_lab.scenario_fixes import lab_fix, printed_fixes
from kubectl_meshdoctor.core.findings import Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix, named, render
from kubectl_meshdoctor.istio.redirect import capture_from_pod
from meshdoctor_lab.apiserver.objects import PodSpecIn, PortSpec, pod_json
from meshdoctor_lab.applied_fixes import CLIENT_FIXES, LabFix, pod_fix
from meshdoctor_lab.netns import istio_rules
from meshdoctor_lab.state import LabError, LabPod, LabPort

A = Fix("first-way", "do this", "everything", "nothing", annotations=(("example.io/a", "1"),))
B = Fix("second-way", "or that", "less", "more", yaml="kind: Thing")


def test_a_finding_prints_its_fixes_in_order_with_what_each_keeps_and_costs():
    f = Finding("x", Severity.ERROR, "t", FlowRef("a:1", "b:2", "eth0"), (), fixes=(A, B))
    assert f.remediation == render((A, B))
    first, second = f.remediation.split("\n---\n")
    assert first.splitlines()[:3] == ["# Fix 1 of 2 (first-way): do this", "#   keeps: everything",
                                      "#   costs: nothing"]
    assert 'example.io/a: "1"' in first and second.endswith("kind: Thing")
    out = f.to_dict()
    assert [x["name"] for x in out["fixes"]] == ["first-way", "second-way"]
    assert out["fixes"][0]["annotations"] == {"example.io/a": "1"}
    assert out["fixes"][1]["text"] == "kind: Thing" and 'example.io/a: "1"' in out["fixes"][0]["text"]
    given = Finding("x", Severity.ERROR, "t", FlowRef("a:1", "b:2", "eth0"), (), remediation="mine", fixes=(A,))
    assert given.remediation == "mine"  # a detector's own text wins
    assert "fixes" not in Finding("x", Severity.ERROR, "t", FlowRef("a:1", "b:2", "eth0"), ()).to_dict()


@pytest.mark.parametrize("bad", [dict(name="Bad Name"), dict(name=""), dict(yaml="", annotations=())])
def test_a_fix_needs_a_name_and_something_to_apply(bad):
    fields = dict(name="ok", title="t", keeps="k", costs="c", yaml="y") | bad
    with pytest.raises(ValueError):
        Fix(**fields)


def test_named_says_which_fixes_there_are():
    assert named((A, B), "second-way") is B
    with pytest.raises(KeyError, match="first-way, second-way"):
        named((A, B), "third")


def test_the_collision_prints_tproxy_first_then_the_port_then_the_client():
    fixes = printed_fixes("collision")
    assert [f.name for f in fixes] == ["tproxy", "exclude-port", "client-port"]
    assert dict(fixes[0].annotations) == {"sidecar.istio.io/interceptionMode": "TPROXY"}
    assert "NET_ADMIN" in fixes[0].costs and "four-tuple" in fixes[0].keeps
    assert dict(fixes[1].annotations) == {"traffic.sidecar.istio.io/excludeInboundPorts": "5002"}


def test_a_fix_becomes_the_lab_pods_rules():
    tproxy = pod_fix(*_data("collision", "tproxy"))
    assert (tproxy.interception, tproxy.excluded_ports) == ("TPROXY", ())
    exclude = pod_fix(*_data("collision", "exclude-port"))
    assert (exclude.interception, exclude.excluded_ports) == ("REDIRECT", (5002,))
    assert pod_fix(*_data("collision", "client-port")).name in CLIENT_FIXES
    assert pod_fix("").name == ""
    with pytest.raises(KeyError, match="tproxy, exclude-port, client-port"):
        lab_fix("collision", "restart-it")
    with pytest.raises(KeyError, match="nothing there prints a fix"):
        lab_fix("healthy", "tproxy")
    with pytest.raises(LabError, match="no way to apply"):
        pod_fix("restart-it")
    with pytest.raises(LabError, match="does not render"):
        pod_fix("x", (("sidecar.istio.io/inject", "false"),))


def _data(scenario: str, name: str) -> tuple:
    fix = lab_fix(scenario, name)
    assert isinstance(fix, LabFix)
    return fix.name, fix.annotations


def test_istio_rules_follow_the_mode_and_the_excluded_ports():
    redirect = istio_rules("REDIRECT", (5002,)).splitlines()
    assert redirect.index("-A ISTIO_INBOUND -p tcp --dport 5002 -j RETURN") \
        < redirect.index("-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN") \
        < redirect.index("-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT")
    assert "5002" not in istio_rules("REDIRECT")
    tproxy = istio_rules("TPROXY", (5002,)).splitlines()
    assert "-A ISTIO_TPROXY ! -d 127.0.0.1/32 -p tcp -j TPROXY --tproxy-mark 1337/0xffffffff --on-port 15006" in tproxy
    assert tproxy.index("-A ISTIO_INBOUND -p tcp --dport 5002 -j RETURN") \
        < tproxy.index("-A ISTIO_INBOUND -p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT")
    assert not [line for line in tproxy if "ISTIO_IN_REDIRECT" in line and line.startswith("-A ISTIO_INBOUND")]
    with pytest.raises(LabError):
        istio_rules("NONE")


def _lab_pod(fix: str) -> dict:
    applied = pod_fix(*_data("collision", fix)) if fix else pod_fix("")
    lab_pod = LabPod("web", "collision", "ns", "ns-c", "198.18.1.2", "198.18.1.1",
                     (LabPort("http", 5000), LabPort("tcp-echo", 5002)), "uid-1", fix=applied.name,
                     annotations=applied.annotations)
    assert LabPod.from_json(lab_pod.to_json()) == lab_pod
    spec = PodSpecIn.from_json(lab_pod.to_json())
    assert spec.ports == (PortSpec("http", 5000), PortSpec("tcp-echo", 5002))
    return pod_json(spec, "shop", 0.0, 1, [], [])


def test_the_pod_object_shows_the_fix_as_the_injector_renders_it():
    pod = _lab_pod("tproxy")
    assert pod["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] == "TPROXY"
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")
    assert proxy["securityContext"]["runAsUser"] == 0 and proxy["securityContext"]["capabilities"]["add"] == [
        "NET_ADMIN"]
    capture = capture_from_pod(pod)  # what watch and lint read back: the mode istio-init ran with
    assert capture.mode == "TPROXY" and capture.redirect_map().listener_for(5002) is None
    excluded = capture_from_pod(_lab_pod("exclude-port"))
    assert excluded.mode == "REDIRECT" and not excluded.captured(5002) and excluded.captured(5000)
    default = capture_from_pod(_lab_pod(""))
    assert default.mode == "REDIRECT" and default.captured(5002)


def test_lab_up_fix_takes_a_name_for_every_pod_or_pod_equals_name_for_one():
    from meshdoctor_lab.command import _fixes
    from meshdoctor_lab import lab

    pods = ["collision", "fixed=collision", "healthy"]
    assert _fixes(lab, pods, []) is None
    one = _fixes(lab, pods, ["fixed=tproxy"])
    assert one == {"fixed": lab_fix("collision", "tproxy")}
    both = _fixes(lab, ["collision", "fixed=collision"], ["exclude-port", "fixed=tproxy"])  # its own overrides
    assert {p: f.name for p, f in both.items()} == {"collision": "exclude-port", "fixed": "tproxy"}
    with pytest.raises(KeyError, match="no pod other"):
        _fixes(lab, pods, ["other=tproxy"])
    with pytest.raises(KeyError, match="scenario healthy has no fix 'tproxy'"):
        _fixes(lab, pods, ["tproxy"])  # every pod: healthy has none
    assert _fixes(lab, ["nosuch"], ["tproxy"]) == {}  # lab.up names the unknown pod
    with pytest.raises(KeyError, match="pod fixed is given two fixes"):
        _fixes(lab, pods, ["fixed=tproxy", "fixed=exclude-port"])
    with pytest.raises(KeyError, match="a lab pod takes one fix"):
        _fixes(lab, pods, ["tproxy", "exclude-port"])


def test_the_policy_classes_lab_fixes_become_the_istio_settings_they_name():
    from meshdoctor_lab.scenarios.table import SETUPS

    def sidecar(scenario: str, name: str):
        fix = lab_fix(scenario, name)  # no detector prints these yet: the lab's own (lab/fixes.py LAB_FIXES)
        return pod_fix(fix.name, fix.annotations, fix.settings, fix.labels).setup(SETUPS[scenario]).sidecar

    pool = sidecar("overflow", "pool-limits")
    assert (pool.pool_max_connections, pool.pool_max_pending_requests) == (100, 100)
    panic = sidecar("outlier", "min-health-percent")
    assert panic.outlier_min_health_percent == 50 and panic.outlier_max_ejection_percent == 100
    assert sidecar("outlier", "max-ejection-percent").outlier_max_ejection_percent == 50
    assert sidecar("no-route", "default-route").vs_catch_all is True
    permissive = sidecar("mtls-strict", "permissive-mtls")
    assert permissive.mtls_mode == "STRICT" and permissive.port_mode(5000) == "PERMISSIVE"
    assert permissive.port_mode(5002) == "STRICT"
    assert sidecar("tls-to-plaintext", "tls-disable").upstream_tls_mode == "DISABLE"
    with pytest.raises(KeyError, match="its fixes: pool-limits"):
        lab_fix("overflow", "tproxy")
    with pytest.raises(LabError, match="not one the lab renders"):
        pod_fix("x", settings=(("DestinationRule.trafficPolicy.tls.mode", "SIMPLE"),))
    with pytest.raises(LabError, match="does not render"):
        pod_fix("x", settings=(("PeerAuthentication.portLevelMtls[http].mode", "PERMISSIVE"),))


def test_the_conntrack_invalid_fixes_become_istio_inits_rule_and_the_namespaces_sysctl():
    """invalid-drop's annotation is proxyMetadata INVALID_DROP, which istio-init reads (strconv.ParseBool); the lab
    then adds istio/istio's drop-invalid.golden mangle rules. conntrack-be-liberal is the namespace's sysctl."""
    from meshdoctor_lab.applied_fixes import drops_invalid
    from meshdoctor_lab.netns import ISTIO_DROP_INVALID_RULES
    from meshdoctor_lab.scenarios.table import SETUPS

    drop = lab_fix("conntrack-invalid", "invalid-drop")
    applied = pod_fix(drop.name, drop.annotations, drop.settings, drop.labels)
    assert applied.drops_invalid and not applied.setup(SETUPS["conntrack-invalid"]).conntrack_be_liberal
    assert "-A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP\n-A ISTIO_DROP -j DROP\n" \
        in ISTIO_DROP_INVALID_RULES
    liberal = lab_fix("conntrack-invalid", "conntrack-be-liberal")
    applied = pod_fix(liberal.name, liberal.annotations, liberal.settings, liberal.labels)
    assert not applied.drops_invalid and applied.setup(SETUPS["conntrack-invalid"]).conntrack_be_liberal
    assert [drops_invalid(v) for v in ('proxyMetadata:\n  INVALID_DROP: "false"\n', "proxyMetadata: {}", "", "[",
                                       "proxyMetadata:\n  INVALID_DROP: true\n")] == [False, False, False, False, True]
