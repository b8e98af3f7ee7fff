"""A ``watch --write-pcap DIR`` folder read back by ``analyze DIR`` with the pod's ``kubectl logs`` beside the
captures (README: "keep each pod's captures and its sidecar's log in the pod's directory"): the pod is the one
watch captured, not the folder's name, and a log line from before the capture is said to be outside it instead
of asking for the capture that was given.

The captures and the access-log lines are real Envoy 1.40's from the lab's stale-keepalive scenario
(tests/data/envoy-1.40-mesh/stale-keepalive/server). A sidecar's log covers its whole life, so the same 503 UC
line is added once more, a minute earlier (a round of the scenario before watch started)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kubectl_meshdoctor.commands.capture_meta import META_NAME, CaptureMeta, read_meta, write_meta
from kubectl_meshdoctor.sources.files import InputError

from ..helpers import analyze_json

SERVER = os.path.join(os.path.dirname(__file__), "..", "data", "envoy-1.40-mesh", "stale-keepalive", "server")
POD = "stale-keepalive"


def _access_lines() -> list[str]:
    """The access-log lines of the recorded container log (a sidecar at Istio's default log levels logs only
    those)."""
    with open(os.path.join(SERVER, "istio-proxy.log"), encoding="utf-8") as fh:
        return [line for line in fh if line.startswith("[20")]


def _folder(tmp_path, meta: bool):
    """``s43nu-cap/`` as ``watch pod/stale-keepalive --write-pcap s43nu-cap`` leaves it (with or without its
    metadata file), plus the pod's log, its 503 UC line also a minute before the capture."""
    d = tmp_path / "s43nu-cap"
    d.mkdir()
    for iface in ("lo", "eth0"):
        shutil.copy(os.path.join(SERVER, f"{iface}.pcap"), d / f"{POD}-{iface}.pcap")
    if meta:
        write_meta(d, [CaptureMeta(f"{POD}-{i}.pcap", POD, "default", i) for i in ("lo", "eth0")])
    lines = _access_lines()
    failing = next(line for line in lines if '" 503 UC ' in line)
    stamp = failing[1:25]
    assert stamp.startswith("2026-12-04T00:04:"), stamp  # the recording's minute: the earlier line is 00:03
    earlier = failing.replace(stamp, stamp.replace("T00:04:", "T00:03:"), 1).replace('"d7b55d82', '"e7b55d82')
    (d / "istio-proxy.log").write_text(earlier + "".join(lines))
    return d


def test_the_pod_is_watchs_and_the_packet_problem_comes_first(tmp_path):
    code, report = analyze_json(_folder(tmp_path, meta=True))
    assert code == 1
    assert report["source"]["pod"] == POD if "pod" in report["source"] else True
    assert {f["pod"] for f in report["findings"]} == {POD}
    groups = report["groups"]
    assert [g["detector"] for g in groups] == ["stale-keepalive", "stale-keepalive"], groups
    first, second = (report["findings"][g["instances"][0]] for g in groups)
    assert "packets" in first["stands_on"] and "packets" not in second["stands_on"]
    # The log-only line is the one a minute before the capture: said so, and not sent to capture the pod again.
    assert second["details"]["outside_capture"]["before_s"] > 50
    assert "before the captures given began" in second["explanation"]
    assert "watch pod/" not in second["remediation"] and "Capture the upstream" not in second["remediation"]
    assert "problem with packet evidence" in second["remediation"]
    assert META_NAME not in json.dumps(report["source"]) and not report["problems"], report["problems"]


def test_a_folder_without_watchs_metadata_keeps_its_name(tmp_path):
    code, report = analyze_json(_folder(tmp_path, meta=False))
    assert code == 1
    assert {f["pod"] for f in report["findings"]} == {"s43nu-cap"}


def test_write_meta_keeps_other_files_and_refuses_a_link(tmp_path):
    write_meta(tmp_path, [CaptureMeta("a-lo.pcap", "a", "ns", "lo")])
    write_meta(tmp_path, [CaptureMeta("b-lo.pcap", "b", "ns", "lo")])
    assert {m.pod for m in read_meta(str(tmp_path)).values()} == {"a", "b"}
    assert os.stat(tmp_path / META_NAME).st_mode & 0o777 == 0o600
    other = tmp_path / "other"
    other.mkdir()
    (other / META_NAME).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(OSError):
        write_meta(other, [CaptureMeta("c-lo.pcap", "c", "ns", "lo")])
    assert not (tmp_path / "elsewhere.json").exists()


def test_two_folders_of_one_watched_pod_are_refused(tmp_path):
    from kubectl_meshdoctor.commands.capture_meta import named_by_watch
    from kubectl_meshdoctor.sources.pod_inputs import pod_inputs

    a = _folder(tmp_path, meta=True)
    b = tmp_path / POD
    b.mkdir()
    shutil.copy(os.path.join(SERVER, "lo.pcap"), b / "lo.pcap")
    with pytest.raises(InputError, match="two pods|named so"):
        named_by_watch(pod_inputs([str(a), str(b)]))
