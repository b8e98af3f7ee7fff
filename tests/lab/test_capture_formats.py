"""`analyze` on the captures people really have: pcapng with interface blocks, `tcpdump -i any` (Linux cooked
v2 and v1, as ksniff writes), and lo and eth0 as separate files; all recorded from the lab's collision pod at
the same time, so all must tell the same story."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from meshdoctor_lab import lab
from meshdoctor_lab.scenarios import challenge_ack_count
from ..waiting import wait_until
from .lab_names import lab_name

pytestmark = pytest.mark.lab

TCPDUMP = ("-n", "-B", "32768", "-U", "--immediate-mode")


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    name = lab_name("f")
    out = tmp_path_factory.mktemp("formats")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, ("collision",), period=1.5)
    try:
        netns = state.pod("collision").netns
        run = ["ip", "netns", "exec", netns]
        commands = {
            # -B 32768 (KiB), as the product's own tcpdump: with --immediate-mode libpcap's ring holds frames of
            # the snap length (256 KiB), so the default 2 MiB holds 8, and a tcpdump starved by a busy machine
            # lost packets mid-connection.
            "lo.pcap": ["tcpdump", "-i", "lo", *TCPDUMP, "-w", str(out / "lo.pcap"), "tcp"],
            "eth0.pcap": ["tcpdump", "-i", "eth0", *TCPDUMP, "-w", str(out / "eth0.pcap"), "tcp"],
            "any-sll2.pcap": ["tcpdump", "-i", "any", *TCPDUMP, "-w", str(out / "any-sll2.pcap"), "tcp"],
            "any-sll1.pcap": ["tcpdump", "-i", "any", "-y", "LINUX_SLL", *TCPDUMP, "-w", str(out / "any-sll1.pcap"),
                              "tcp"],
            "both.pcapng": ["dumpcap", "-f", "tcp", "-i", "lo", "-i", "eth0", "-w", str(out / "both.pcapng")],
            # One dumpcap an interface: pcapng whose interface block names it, for mergecap below.
            "lo.pcapng": ["dumpcap", "-f", "tcp", "-i", "lo", "-w", str(out / "lo.pcapng")],
            "eth0.pcapng": ["dumpcap", "-f", "tcp", "-i", "eth0", "-w", str(out / "eth0.pcapng")],
        }
        procs = [subprocess.Popen(run + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for cmd in commands.values()]
        try:
            deadline = time.monotonic() + 20
            for p in procs:  # "listening on" (tcpdump) / "Capturing on" (dumpcap): the interfaces are open
                line = ""
                while "listening on" not in line and "Capturing on" not in line:
                    assert time.monotonic() < deadline and p.poll() is None, "capture did not start"
                    line = p.stderr.readline()
            ready_ts = time.time()
            # Two collision rounds while all capture: the first is compared, the second gives every capturer
            # time to write the first out (dumpcap has no immediate mode and loses what it holds at SIGINT).
            first_seen_ts = None
            before = challenge_ack_count(netns)

            def count() -> int | None:  # noting when the first of the two is seen
                nonlocal first_seen_ts
                n = challenge_ack_count(netns)
                if first_seen_ts is None and n is not None and n > before:
                    first_seen_ts = time.time()
                return n

            wait_until("two challenge ACKs in the lab", deadline + 30 - time.monotonic(), count,
                       ok=lambda n: n is not None and n >= before + 2)
        finally:
            for p in procs:
                p.send_signal(signal.SIGINT)
            for p in procs:
                p.wait(timeout=20)
    finally:
        lab.down(state.state_dir)
    return out, state.pod("collision"), (ready_ts, first_seen_ts)


def analyze(*files: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *files, "-o", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def collision_flows(report: dict, window: tuple[float, float] = (0.0, float("inf"))) -> set[tuple[str, str, str]]:
    """Collisions whose SYN came within ``window`` (seconds since the epoch), when every capture ran."""
    return {(f["flow"]["client"], f["flow"]["server"], f["flow"]["iface"]) for f in report["findings"]
            if f["detector"] == "tuple-collision" and f["severity"] == "error"
            and window[0] <= f["evidence"][0]["ts"] <= window[1]}


def test_separate_files_are_the_reference(recordings):
    out, pod, window = recordings
    report = analyze(str(out / "lo.pcap"), str(out / "eth0.pcap"))
    flows = collision_flows(report, window)
    assert flows and all(server == f"{pod.pod_ip}:5002" and iface == "eth0" for _, server, iface in flows)
    assert set(report["stats"]["interfaces"]) == {"lo", "eth0"}


def packets_by_iface(path, iface="unknown", force=False) -> dict[tuple, str]:
    """(src, sport, dst, dport, seq, ack, flags) -> the interface our reader attributes the packet to."""
    import asyncio

    from kubectl_meshdoctor.sources.tshark import read_file

    seen: dict[tuple, str] = {}

    def keep(ev):
        seen[(ev.src, ev.sport, ev.dst, ev.dport, ev.seq, ev.ack, int(ev.flags))] = ev.iface

    asyncio.run(read_file(str(path), str(path), iface, keep, force_iface=force))
    return seen


@pytest.mark.parametrize("name", ["any-sll2.pcap", "any-sll1.pcap", "both.pcapng"])
def test_mixed_captures_attribute_lo_and_eth0(recordings, name):
    out, _, window = recordings
    truth = packets_by_iface(out / "lo.pcap", "lo", True) | packets_by_iface(out / "eth0.pcap", "eth0", True)
    mixed = packets_by_iface(out / name)
    common = set(truth) & set(mixed)
    # The captures ran side by side and may start or stop a few packets apart; what both saw must agree.
    for iface in ("lo", "eth0"):
        assert sum(1 for k in common if truth[k] == iface) >= 5, (name, iface, len(common))
    wrong = {k: (mixed[k], truth[k]) for k in common if mixed[k] != truth[k]}
    assert wrong == {}
    reference = analyze(str(out / "lo.pcap"), str(out / "eth0.pcap"))
    assert collision_flows(analyze(str(out / name)), window) == collision_flows(reference, window) != set()


@pytest.mark.parametrize("inputs, how", [(("lo.pcap", "eth0.pcap"), "all"), (("lo.pcap", "eth0.pcap"), "none"),
                                         (("lo.pcapng", "eth0.pcapng"), "all")],
                         ids=["unnamed-one-block", "unnamed-two-blocks", "named"])
def test_a_mergecap_of_lo_and_eth0_reads_as_the_two_files(recordings, tmp_path, inputs, how):
    """Issue 31, item 6: `mergecap` of a pod's two captures, called lo.pcapng (its name says nothing of what is
    inside): each packet on its own interface, so the same collisions as the two files, on eth0."""
    out, _, window = recordings
    merged = tmp_path / "lo.pcapng"
    subprocess.run(["mergecap", "-I", how, "-w", str(merged), *(str(out / n) for n in inputs)], check=True,
                   capture_output=True)
    report = analyze(str(merged))
    reference = analyze(*(str(out / n) for n in inputs))
    assert set(report["stats"]["interfaces"]) == {"lo", "eth0"}
    assert collision_flows(report, window) == collision_flows(reference, window) != set()


def test_two_files_are_merged_by_time(recordings):
    """lo and eth0 given together come out in time order: the report's first finding is the earliest."""
    out, _, _ = recordings
    report = analyze(str(out / "eth0.pcap"), str(out / "lo.pcap"))
    assert report["stats"]["duration_s"] > 0
    times = [e["ts"] for f in report["findings"] for e in f["evidence"][:1]]
    assert times == sorted(times)
