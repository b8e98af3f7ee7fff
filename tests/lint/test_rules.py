"""Static lint rules over Pod objects derived from tests/lint/reference/pod_istio_sample.yaml.

tests/lint/data: classic.yaml and native.yaml are the reference DOC 1 and DOC 2 verbatim; every other file is a
copy with one change, named in its header comment.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from kubectl_meshdoctor.core.findings import SPEC, Severity
from kubectl_meshdoctor.lint import RULES, SEVERITIES, lint_pod, lint_pods

DATA = Path(__file__).parent / "data"
# Two Pods as the API returns them for an Istio sidecar (classic and native), with their sources in the header.
REFERENCE = Path(__file__).parent / "reference" / "pod_istio_sample.yaml"
W, E, I = Severity.WARNING, Severity.ERROR, Severity.INFO


def pod(name: str) -> dict:
    return yaml.safe_load((DATA / f"{name}.yaml").read_text())


def only(findings, rule_id):
    """The single finding of ``rule_id`` (fails when there are none or several)."""
    got = [f for f in findings if f.detector == rule_id]
    assert len(got) == 1, [(f.detector, f.title) for f in findings]
    return got[0]


def none_of(findings, rule_id):
    assert [f.title for f in findings if f.detector == rule_id] == []


def whats(f):
    return [e.what for e in f.evidence]


def yaml_docs(remediation: str) -> list:
    return [d for d in yaml.safe_load_all(remediation) if d is not None]


# Every fixture, and exactly the (rule, severity) pairs it yields.
EXPECTED = {
    "classic": {("redirect-exposure", W), ("hold-application", W)},
    "native": {("excluded-port-exposed", I)},
    "classic-fixed": {("excluded-port-exposed", I)},
    "classic-tproxy": {("hold-application", W)},
    "native-redirect-exposure": {("redirect-exposure", W)},
    "native-probe-port": {("probe-port", E), ("excluded-port-exposed", I)},
    "native-probe-named": {("probe-port", E), ("excluded-port-exposed", I)},
    "native-probe-not-rewritten": {("probe-not-rewritten", W), ("excluded-port-exposed", I)},
    "native-restart-liveness": {("restart-loop", E), ("excluded-port-exposed", I)},
    "native-restart-oom": {("restart-loop", E), ("excluded-port-exposed", I)},
    "native-restart-crash": {("restart-loop", W), ("excluded-port-exposed", I)},
    "native-sidecar-not-ready": {("sidecar-not-ready", E), ("excluded-port-exposed", I)},
    "no-sidecar": {("no-sidecar", E)},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_yields_exactly_its_rules(name):
    findings = lint_pod(pod(name))
    assert {(f.detector, f.severity) for f in findings} == EXPECTED[name]
    assert len(findings) == len(EXPECTED[name])  # one finding per rule on these pods


def test_every_fixture_is_commented_as_derived_from_the_reference():
    files = sorted(DATA.glob("*.yaml"))
    assert {p.stem for p in files} == set(EXPECTED)
    for p in files:
        assert p.read_text().startswith("# Derived from tests/lint/reference/pod_istio_sample.yaml DOC ")


def test_verbatim_fixtures_match_the_reference():
    doc1, doc2 = yaml.safe_load_all(REFERENCE.read_text())
    assert pod("classic") == doc1
    assert pod("native") == doc2


def test_every_rule_is_registered_with_its_severities():
    assert list(RULES) == ["redirect-exposure", "probe-port", "restart-loop", "no-sidecar", "sidecar-not-ready",
                           "hold-application", "probe-not-rewritten", "excluded-port-exposed"]
    assert SEVERITIES["probe-port"] == "error" and SEVERITIES["redirect-exposure"] == "warning"


# ---------------------------------------------------------------------------------------------------- the reference pod


def test_reference_classic_pod_as_is():
    """DOC 1 (Istio 1.26 classic sidecar, default annotations, a netadmin debug container) yields two warnings:
    - redirect-exposure: istio-init ran with -b '*' -d 15090,15021,15020, so both app ports 5000 and 5002 are
      REDIRECTed to 15006;
    - hold-application: istio-proxy is the last container with no postStart `pilot-agent wait`, so orders can
      start before Envoy.
    Nothing else: the probes rewritten to 15020 point (via ISTIO_KUBE_APP_PROBERS) at 5002 and 5000, both declared;
    nothing restarted; the sidecar is ready; the ephemeral container is ignored. No error: `lint` exits 0."""
    findings = lint_pod(pod("classic"))
    assert [(f.detector, f.severity) for f in findings] == [("redirect-exposure", W), ("hold-application", W)]
    exposure, hold = findings
    assert "spec.initContainers[0].args = istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i * -x  -b * " \
           "-d 15090,15021,15020 --log_output_level=default:info" in whats(exposure)
    assert "spec.containers[0].ports[0].containerPort = 5000" in whats(exposure)
    assert "spec.containers[0].ports[1].containerPort = 5002" in whats(exposure)
    assert "spec.containers[1].name = istio-proxy (position 2 of 2, no postStart pilot-agent wait)" in whats(hold)
    assert not any(f.severity is E for f in findings)
    assert not any("debugger" in w for f in findings for w in whats(f))


def test_reference_native_pod_as_is():
    """DOC 2 (native sidecar, 5002 excluded by annotation): only the info that 5002 bypasses the sidecar."""
    f = only(lint_pod(pod("native")), "excluded-port-exposed")
    assert f.severity is I and f.details["path"] == "spec.containers[0].ports[1].containerPort"
    assert 'metadata.annotations["traffic.sidecar.istio.io/excludeInboundPorts"] = 5002,15020' in whats(f)


def test_finding_shape_for_static_rules():
    findings = lint_pods(pod(n) for n in sorted(EXPECTED))
    assert {f.detector for f in findings} == set(RULES)
    for f in findings:
        name = f.pod
        # A spec finding has no flow: it says so, and JSON keeps a flow's shape for it (client "-", no iface).
        assert f.connection is None and f.flow.kind == SPEC and not f.flow.of_one_connection
        assert f.to_dict()["flow"] == {"client": "-", "server": f.flow.server, "iface": ""}
        host, _, port = f.flow.server.rpartition(":")
        assert host in ("10.244.1.23", "10.244.2.41") and (port == "-" or port.isdigit())
        assert f.evidence and all(e.source == f"pod/{name}" and e.iface == "" and e.frame is None and e.ts == 0.0
                                  and e.kind == SPEC for e in f.evidence)
        assert all(d["frame"] == 0 for d in f.to_dict()["evidence"])  # the JSON's "no frame", as it always was
        # Each field by its field, never as a frame.
        assert all(e.cited().startswith(f"pod/{name} spec field ") and "frame" not in e.cited()
                   for e in f.evidence if e.name)
        assert any(e.what.startswith(f.details["path"]) for e in f.evidence), (f.detector, f.details["path"])
        assert f.title and "\n" not in f.title and f.explanation and f.remediation
        json.dumps(f.to_dict())


def test_every_printed_lint_fix_is_yaml_to_paste_and_its_annotations_are_what_it_prints():
    """Shell commands go in comments or the note: a fix's text parses as YAML, and the annotations the lab
    applies are the ones in that YAML."""
    findings = lint_pods(pod(n) for n in sorted(EXPECTED))
    fixed = {f.detector for f in findings if f.fixes}
    assert fixed == set(RULES) - {"restart-loop", "sidecar-not-ready"}  # those two print where to look, no fix
    for f in findings:
        for fix in f.fixes:
            docs = yaml_docs(fix.text)
            assert len(docs) == 1 and isinstance(docs[0], dict), (f.detector, fix.text)
            if fix.annotations:
                assert docs[0]["metadata"]["annotations"] == dict(fix.annotations), fix.text
            if fix.labels:
                assert docs[0]["metadata"]["labels"] == dict(fix.labels), fix.text


# ---------------------------------------------------------------------------------------------------- redirect-exposure


def test_redirect_exposure_classic():
    f = only(lint_pod(pod("classic")), "redirect-exposure")
    assert f.severity is W
    assert f.details["path"] == "spec.containers[0].ports[1].containerPort"
    assert f.details["ports"] == [5000, 5002] and f.details["listener"] == 15006
    assert f.flow.server == "10.244.1.23:5002"
    assert 'traffic.sidecar.istio.io/excludeInboundPorts: "5002"' in f.remediation
    assert "TPROXY" in f.explanation and "run.go" in f.explanation
    # The collision's fixes, the mesh kept first: TPROXY, then the port out of capture.
    tproxy, ann = yaml_docs(f.remediation)
    assert tproxy["metadata"]["annotations"] == {"sidecar.istio.io/interceptionMode": "TPROXY"}
    assert ann["metadata"]["annotations"] == {"traffic.sidecar.istio.io/excludeInboundPorts": "5002"}
    assert [fix.name for fix in f.fixes] == ["tproxy", "exclude-port"]


def test_redirect_exposure_fine_when_the_second_port_is_excluded():
    none_of(lint_pod(pod("classic-fixed")), "redirect-exposure")
    none_of(lint_pod(pod("native")), "redirect-exposure")


def test_redirect_exposure_native_reads_the_cni_annotations():
    f = only(lint_pod(pod("native-redirect-exposure")), "redirect-exposure")
    assert f.severity is W and f.details["path"] == "spec.containers[0].ports[1].containerPort"
    assert 'metadata.annotations["traffic.sidecar.istio.io/excludeInboundPorts"] = 15020' in whats(f)
    assert 'traffic.sidecar.istio.io/excludeInboundPorts: "5002"' in f.remediation


def test_redirect_exposure_not_reported_under_tproxy():
    # TPROXY keeps the original destination port on the accepted socket: no two ports share a four-tuple.
    none_of(lint_pod(pod("classic-tproxy")), "redirect-exposure")


def test_redirect_exposure_keeps_user_excludes_and_honours_include_lists():
    p = pod("native-redirect-exposure")
    p["spec"]["containers"][0]["ports"].append({"containerPort": 5004, "name": "grpc", "protocol": "TCP"})
    p["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"] = "5009,15020"
    f = only(lint_pod(p), "redirect-exposure")
    assert f.details["ports"] == [5000, 5002, 5004]
    assert 'traffic.sidecar.istio.io/excludeInboundPorts: "5002,5004,5009"' in f.remediation

    p["metadata"]["annotations"]["traffic.sidecar.istio.io/includeInboundPorts"] = "5000"
    none_of(lint_pod(p), "redirect-exposure")
    p["metadata"]["annotations"]["traffic.sidecar.istio.io/includeInboundPorts"] = "5000,5004"
    assert only(lint_pod(p), "redirect-exposure").details["ports"] == [5000, 5004]
    p["metadata"]["annotations"]["sidecar.istio.io/interceptionMode"] = "NONE"
    none_of(lint_pod(p), "redirect-exposure")


# ---------------------------------------------------------------------------------------------------- probe-port


def test_probe_port_undoes_istio_rewrite():
    f = only(lint_pod(pod("native-probe-port")), "probe-port")
    assert f.severity is E
    assert f.details["path"] == 'spec.initContainers[1].env[20].value["/app-health/orders/livez"].httpGet.port'
    assert f.details["port"] == 5003 and f.flow.server == "10.244.2.41:5003"
    assert "spec.containers[0].livenessProbe.httpGet.port = 15020 (spec.containers[0].livenessProbe.httpGet.path " \
           "= /app-health/orders/livez)" in whats(f)
    assert "ISTIO_KUBE_APP_PROBERS" in f.explanation
    assert "containerPort: 5003" in f.remediation and "livenessProbe:" in f.remediation
    for doc in yaml_docs(f.remediation):
        assert doc["spec"]["containers"][0]["name"] == "orders"


def test_probe_port_named_port_missing():
    f = only(lint_pod(pod("native-probe-named")), "probe-port")
    assert f.severity is E and f.details["path"] == "spec.containers[0].livenessProbe.httpGet.port"
    assert f.details["port"] == "admin" and 'named port "admin"' in f.title
    assert "name: admin" in f.remediation


def test_a_placeholder_left_in_a_probe_fix_is_still_a_probe_port_error():
    """declare-probe-port for a named port cannot know the number: its placeholder is a quoted string, which
    declares nothing, so a fix pasted with it left in is not taken for a fix."""
    broken = pod("native-probe-named")
    f = only(lint_pod(broken), "probe-port")
    declare = next(x for x in f.fixes if x.name == "declare-probe-port")
    (doc,) = yaml_docs(declare.text)
    (added,) = doc["spec"]["containers"][0]["ports"]
    assert isinstance(added["containerPort"], str) and added["containerPort"].startswith("<")
    broken["spec"]["containers"][0]["ports"].append(added)  # what a strategic merge by name gives
    only(lint_pod(broken), "probe-port")


def test_a_rewritten_probe_with_no_original_prints_a_fix_with_quoted_placeholders():
    rewritten = pod("native-probe-port")
    proxy = next(c for c in rewritten["spec"]["initContainers"] if c["name"] == "istio-proxy")
    proxy["env"] = [e for e in proxy["env"] if e["name"] != "ISTIO_KUBE_APP_PROBERS"]
    found = [f for f in lint_pod(rewritten) if f.detector == "probe-port"]
    assert len(found) == 2  # the liveness and the readiness probe
    for f in found:
        (fix,) = f.fixes
        assert fix.name == "probe-original-form"
        (doc,) = yaml_docs(fix.text)
        probe = doc["spec"]["containers"][0][f.details["probe"]]["httpGet"]
        assert probe["port"].startswith("<an app port: ") and probe["path"].startswith("<")


def test_probe_port_fine_on_the_reference_pods():
    # The rewritten probes resolve to 5002 (livez) and 5000 (readyz), both declared by orders.
    for name in ("classic", "native", "classic-fixed", "native-probe-not-rewritten"):
        none_of(lint_pod(pod(name)), "probe-port")


def test_probe_port_rewritten_probe_without_original():
    p = pod("native")
    proxy = p["spec"]["initContainers"][1]
    proxy["env"] = [e for e in proxy["env"] if e["name"] != "ISTIO_KUBE_APP_PROBERS"]
    found = [f for f in lint_pod(p) if f.detector == "probe-port"]
    assert [f.details["probe"] for f in found] == ["livenessProbe", "readinessProbe"]
    assert found[0].details["path"] == "spec.initContainers[1].env[name=ISTIO_KUBE_APP_PROBERS]"
    assert "spec.initContainers[1].env[name=ISTIO_KUBE_APP_PROBERS] = (absent)" in whats(found[0])
    assert found[0].severity is E and "no original" in found[0].title


# ---------------------------------------------------------------------------------------------------- restart-loop


def test_restart_loop_liveness_kill_is_an_error():
    f = only(lint_pod(pod("native-restart-liveness")), "restart-loop")
    assert f.severity is E and f.details["cause"] == "liveness"
    assert f.details["path"] == "status.containerStatuses[0].lastState.terminated"
    assert "status.containerStatuses[0].lastState.terminated.exitCode = 137" in whats(f)
    assert "status.containerStatuses[0].state.waiting.reason = CrashLoopBackOff" in whats(f)
    doc, = yaml_docs(f.remediation)
    assert doc["spec"]["containers"][0]["startupProbe"]["failureThreshold"] == 30


def test_restart_loop_oom_is_an_error_about_memory():
    f = only(lint_pod(pod("native-restart-oom")), "restart-loop")
    assert f.severity is E and f.details["cause"] == "oom" and "OOMKilled" in f.title
    assert "memory:" in f.remediation


def test_restart_loop_without_probe_evidence_is_a_warning():
    f = only(lint_pod(pod("native-restart-crash")), "restart-loop")
    assert f.severity is W and f.details["exit_code"] == 1
    assert "holdApplicationUntilProxyStarts: true" in f.remediation


def test_restart_loop_fine_below_threshold():
    none_of(lint_pod(pod("native")), "restart-loop")
    p = pod("native-restart-liveness")
    p["status"]["containerStatuses"][0]["restartCount"] = 2
    none_of(lint_pod(p), "restart-loop")


# ---------------------------------------------------------------------------------------------------- sidecar


def test_no_sidecar():
    f = only(lint_pod(pod("no-sidecar")), "no-sidecar")
    assert f.severity is E and f.details["path"] == "spec.containers[*].name"
    assert 'metadata.labels["sidecar.istio.io/inject"] = false' in whats(f)
    assert "sidecar.istio.io/inject: \"true\"" in f.remediation
    # The pod's own "false" wins over any namespace label: the fix says so and offers no namespace label.
    assert "wins over any namespace label" in f.remediation and "kubectl label namespace" not in f.remediation


def test_no_sidecar_for_a_pod_that_asks_for_one_or_says_nothing():
    asks = pod("no-sidecar")
    asks["metadata"]["labels"]["sidecar.istio.io/inject"] = "true"
    f = only(lint_pod(asks), "no-sidecar")
    assert "asks for injection" in f.explanation and "opts out" not in f.explanation
    assert f.fixes == () and "mutatingwebhookconfiguration" in f.remediation  # the label is there: nothing to set
    silent = pod("no-sidecar")
    del silent["metadata"]["labels"]["sidecar.istio.io/inject"]
    g = only(lint_pod(silent), "no-sidecar")
    assert [x.name for x in g.fixes] == ["inject-sidecar"] and "kubectl label namespace shop" in g.remediation
    odd = pod("no-sidecar")
    odd["metadata"]["labels"]["sidecar.istio.io/inject"] = "yes"
    assert "neither true nor false" in only(lint_pod(odd), "no-sidecar").explanation


def test_no_sidecar_fine_for_classic_and_native():
    none_of(lint_pod(pod("classic")), "no-sidecar")
    none_of(lint_pod(pod("native")), "no-sidecar")
    # an init container named istio-proxy without restartPolicy Always is no native sidecar
    p = pod("native")
    del p["spec"]["initContainers"][1]["restartPolicy"]
    assert only(lint_pod(p), "no-sidecar").severity is E


def test_sidecar_not_ready_native():
    f = only(lint_pod(pod("native-sidecar-not-ready")), "sidecar-not-ready")
    assert f.severity is E and f.details["path"] == "status.initContainerStatuses[1].ready"
    assert "istioctl proxy-status orders-5f6b7c8d94-7hq2m.shop" in f.remediation


def test_sidecar_not_ready_classic_waiting():
    p = pod("classic")
    st = p["status"]["containerStatuses"][0]
    st.update(ready=False, state={"waiting": {"reason": "CrashLoopBackOff"}})
    f = only(lint_pod(p), "sidecar-not-ready")
    assert f.details["path"] == "status.containerStatuses[0].state.waiting"
    assert "status.containerStatuses[0].state.waiting.reason = CrashLoopBackOff" in whats(f)


def test_sidecar_ready_is_fine():
    for name in ("classic", "native", "classic-fixed"):
        none_of(lint_pod(pod(name)), "sidecar-not-ready")


# ---------------------------------------------------------------------------------------------------- hold-application


def test_hold_application_classic():
    f = only(lint_pod(pod("classic")), "hold-application")
    assert f.severity is W and f.details["path"] == 'metadata.annotations["proxy.istio.io/config"]'
    assert "before Envoy is ready" in f.explanation
    doc, = yaml_docs(f.remediation)
    cfg = yaml.safe_load(doc["metadata"]["annotations"]["proxy.istio.io/config"])
    assert cfg == {"holdApplicationUntilProxyStarts": True}


def test_hold_application_fine_when_held_or_native():
    none_of(lint_pod(pod("classic-fixed")), "hold-application")
    none_of(lint_pod(pod("native")), "hold-application")


def test_hold_application_annotation_without_effect_keeps_other_settings():
    p = pod("classic")
    p["metadata"]["annotations"]["proxy.istio.io/config"] = "holdApplicationUntilProxyStarts: true\nconcurrency: 2\n"
    f = only(lint_pod(p), "hold-application")
    assert f.details["annotation_asks"] is True and "injected without it" in f.title
    doc, = yaml_docs(f.remediation)
    assert yaml.safe_load(doc["metadata"]["annotations"]["proxy.istio.io/config"]) == \
           {"holdApplicationUntilProxyStarts": True, "concurrency": 2}


# ---------------------------------------------------------------------------------------------------- extra rules


def test_probe_not_rewritten():
    f = only(lint_pod(pod("native-probe-not-rewritten")), "probe-not-rewritten")
    assert f.severity is W and f.details["path"] == "spec.containers[0].readinessProbe.httpGet.port"
    assert f.details["port"] == 5000  # the liveness probe on 5002 is not captured: not reported
    assert 'sidecar.istio.io/rewriteAppHTTPProbers: "true"' in f.remediation
    for name in ("classic", "native"):
        none_of(lint_pod(pod(name)), "probe-not-rewritten")


def test_excluded_port_exposed():
    f = only(lint_pod(pod("classic-fixed")), "excluded-port-exposed")
    assert f.severity is I and f.details["port"] == 5002
    assert "spec.initContainers[0].args" in whats(f)[1]
    (fix,) = f.fixes  # an empty list: istio-iptables -d "" excludes nothing, as no annotation does
    assert fix.name == "capture-port" and fix.annotations == (("traffic.sidecar.istio.io/excludeInboundPorts", ""),)
    assert 'traffic.sidecar.istio.io/excludeInboundPorts: ""' in f.remediation and "NetworkPolicy" in f.remediation
    none_of(lint_pod(pod("classic")), "excluded-port-exposed")


def test_lint_pods_concatenates_in_order():
    pods = [pod("classic"), pod("no-sidecar")]
    assert [f.detector for f in lint_pods(pods)] == ["redirect-exposure", "hold-application", "no-sidecar"]
    assert lint_pod(copy.deepcopy(pods[0]), rules=["hold-application"])[0].detector == "hold-application"


# ---------------------------------------------------------------------------------------------- the report of many pods


def test_a_warning_grouped_over_several_pods_names_them_all():
    """`lint -A` over three replicas of DOC 1 (in two namespaces): redirect-exposure, one title on each pod, is
    one group; its heading named only the first pod, as though the other two were fine (issue 16). It names all
    three now, and each occurrence says whose it is."""
    from kubectl_meshdoctor.core.pipeline import PipelineStats
    from kubectl_meshdoctor.core.report_model import LintSource, Report
    from kubectl_meshdoctor.frontends.report import render_markdown, render_text

    replicas = []
    for i, (ns, name) in enumerate([("shop", "orders-a"), ("shop", "orders-b"), ("pay", "orders-c")]):
        p = pod("classic")
        p["metadata"].update(name=name, namespace=ns)
        p["status"]["podIP"] = f"10.244.1.{30 + i}"
        replicas.append(p)
    findings = lint_pods(replicas)
    assert [f.pod for f in findings if f.detector == "redirect-exposure"] == ["orders-a", "orders-b", "orders-c"]
    report = Report(LintSource(tuple(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in replicas)),
                    PipelineStats(), findings)
    text = render_text(report).splitlines()
    (heading,) = [line for line in text if line.startswith("WARNING redirect-exposure")]
    assert heading.startswith("WARNING redirect-exposure 3 pods (orders-a, orders-b, orders-c): app ports ")
    at = text.index(heading)
    assert text[at + 1] == "  3 times"  # a spec has no time to show
    assert text[at + 2] == "  newest, pod/orders-c where: 10.244.1.32:5002 (the pod's spec: no connection)"
    (also,) = [line for line in text[at:] if line.startswith("  also: ")][:1]
    assert also == "  also: pod/orders-b 10.244.1.31:5002, pod/orders-a 10.244.1.30:5002"
    holds = [line for line in text if line.startswith("WARNING hold-application")]
    assert len(holds) == 3 and all(" pod/orders-" in line and " pods (" not in line for line in holds)  # one each
    markdown = render_markdown(report)
    assert "- pods: orders-a, orders-b, orders-c\n" in markdown
    assert "| warning | `redirect-exposure` |  | 3 | 3 pods | app ports" in markdown and "| - | - |" in markdown
    import json

    from kubectl_meshdoctor.frontends.report import render_json
    (group,) = [g for g in json.loads(render_json(report))["groups"] if g["detector"] == "redirect-exposure"]
    assert group["pods"] == ["orders-a", "orders-b", "orders-c"] and "pod" not in group and "server" not in group
    assert markdown.count("- pod: orders-a\n") == 1  # hold-application's own section only


@pytest.mark.parametrize("owner, labels, command", [
    ({"kind": "ReplicaSet", "name": "orders-7d9c8b6f5d", "controller": True}, {"pod-template-hash": "7d9c8b6f5d"},
     "kubectl rollout restart deployment/orders -n shop"),
    ({"kind": "StatefulSet", "name": "db", "controller": True}, {}, "kubectl rollout restart statefulset/db -n shop"),
    ({"kind": "DaemonSet", "name": "agent", "controller": True}, {}, "kubectl rollout restart daemonset/agent -n shop"),
    ({"kind": "ReplicaSet", "name": "legacy", "controller": True}, {},  # a ReplicaSet of its own: no rollout
     "kubectl delete pod p -n shop (its owner, replicaset/legacy, creates it again)"),
    ({"kind": "Job", "name": "once", "controller": True}, {}, "kubectl delete pod p -n shop (its owner, job/once, "),
    (None, {}, "kubectl rollout restart deployment/<owner> -n shop"),  # a pod that names no owner
])
def test_the_recreate_note_names_the_pods_own_owner(owner, labels, command):
    """Issue 32, item 7: a fix said `rollout restart deployment/<owner>` where the pod names its owner."""
    from kubectl_meshdoctor.lint.podview import PodView

    meta = {"name": "p", "namespace": "shop", "labels": labels, **({"ownerReferences": [owner]} if owner else {})}
    assert command in PodView({"metadata": meta}).recreate_note()


def test_a_reference_pods_fix_restarts_its_deployment():
    findings = lint_pod(yaml.safe_load_all(REFERENCE.read_text()).__next__())
    notes = [f.remediation for f in findings if "Then recreate the pods" in f.remediation]
    assert notes and all("kubectl rollout restart deployment/orders -n " in n for n in notes)
