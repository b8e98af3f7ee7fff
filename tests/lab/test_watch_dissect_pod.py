"""`watch --dissect pod` on the pod lab: tshark runs in the debug container beside tcpdump (the lab's debug
container runs the machine's own tshark, as netshoot's would), and only its lines cross the exec stream."""

from __future__ import annotations


import psutil
import pytest

from meshdoctor_lab import lab

from ..waiting import wait_until
from .test_watch import collisions, meshdoctor, watch_json
from .lab_names import lab_name

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    name = lab_name("d")
    state_dir = tmp_path_factory.mktemp("lab") / name
    state = lab.up(name, state_dir, ("collision",), period=1.5)
    try:
        yield state
    finally:
        lab.down(state_dir)


def capture_processes(netns: str) -> list[str]:
    """Names of the tcpdump and tshark processes in the pod's network namespace."""
    from meshdoctor_lab import netns as lab_netns

    names = []
    for pid in lab_netns.netns_pids(netns):
        try:
            name = psutil.Process(pid).name()
        except psutil.NoSuchProcess:
            continue
        if name in ("tcpdump", "tshark"):
            names.append(name)
    return names


def test_the_pods_tshark_finds_the_collision_and_reads_every_captured_packet(lab_state):
    pod = lab_state.pod("collision")
    rc, report, stderr = watch_json(lab_state, "collision", 7, "--dissect", "pod")
    assert rc == 1, stderr
    assert report["source"]["dissect"] == "pod"
    found = collisions(report)
    assert found, report["findings"]
    f = found[0]
    client_port = int(f["flow"]["client"].rsplit(":", 1)[1])
    assert f["flow"]["server"] == f"{pod.pod_ip}:5002" and f["flow"]["iface"] == "eth0"
    syn, ack = f["evidence"][0], f["evidence"][1]
    assert syn["what"] == "SYN" and ack["what"].startswith("challenge ACK")
    assert syn["dst"].endswith(":5002") and syn["src"].endswith(f":{client_port}")
    assert 0 < syn["frame"] < ack["frame"]  # frame numbers of tcpdump's capture in the pod
    assert report["problems"] == [], report["problems"]
    for iface in ("lo", "eth0"):
        cap = report["source"]["captures"][iface]
        # tcpdump stopped by the end of stdin (it said how many it captured), and the pod's tshark read all
        assert cap["captured"] and cap["frames_read"] == cap["captured"], (iface, cap)
    # tshark's lines, not the pcap, crossed: no capture bytes kept here, and both processes ended in the pod
    assert "files" not in report["source"]
    wait_until("no tcpdump or tshark left in the pod", 15, lambda: not capture_processes(pod.netns))


def test_write_pcap_with_dissect_pod_is_one_line_exit_2(lab_state, tmp_path):
    proc = meshdoctor("watch", "pod/collision", "--kubeconfig", str(lab_state.kubeconfig), "--no-tui",
                      "--dissect", "pod", "--write-pcap", str(tmp_path / "pcaps"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--write-pcap" in proc.stderr
    assert not (tmp_path / "pcaps").exists()
