"""shutdown-ordering: the pod's sidecar killed by pilot-agent after its drain while callers still call.

The recordings (tests/data/README.md, lab-shutdown-*) are real Envoy 1.40 on both ends of an mTLS hop in the lab,
the pod's sidecar drained and killed as pilot-agent does it (lab/meshdoctor_lab/shutdown.py)."""

from __future__ import annotations

from pathlib import Path

from kubectl_meshdoctor_plugins import shutdown_ordering

from ..helpers import A, F, P, R, S, Wire, analyze_json, run

DATA = Path(__file__).resolve().parent.parent / "data"
CLASSIC = DATA / "lab-shutdown-classic"
POD = "198.18.1.2:5000"
CALLER = "198.18.1.1"


def caller_lines(flags: str) -> list[str]:
    text = (CLASSIC / "healthy-caller" / "istio-proxy.log").read_text()
    return [line for line in text.splitlines() if line.startswith("[") and f'" 503 {flags} ' in line]


def test_the_recorded_classic_shutdown_is_named_on_both_pods_with_every_failed_line():
    code, report = analyze_json(CLASSIC / "healthy", CLASSIC / "healthy-caller")
    found = report["findings"]
    assert code == 1 and {f["detector"] for f in found} == {"shutdown-ordering"}, \
        {(f["detector"], f.get("variant")) for f in found}
    refusals = [f for f in found if f["envoy_flags"] == ["UF", "URX"]]
    cuts = [f for f in found if f["envoy_flags"] == ["UC"]]
    assert refusals and len(cuts) == 1
    for f in refusals:
        syn, rst = f["evidence"][:2]
        assert (syn["flags"], syn["dst"], rst["flags"], rst["src"]) == ("S", POD, "R.", POD)
        assert syn["src"].startswith(CALLER) and f["flow"]["server"] == POD
        last = next(e for e in f["evidence"] if "last connection" in e["what"])
        assert last["flags"] == "S." and last["src"] == POD and last["ts"] < rst["ts"]
        assert any(e.get("record") == "ServerHello" and e["src"] == POD for e in f["evidence"])
        assert [x["name"] for x in f["fixes"]] == ["native-sidecar", "termination-drain"]
    # every 503 URX,UF the caller logged is quoted by a refusal; its 503 UC by the connection the exit cut
    quoted = {line for f in refusals for line in f.get("access_log", [])}
    assert set(caller_lines("URX,UF")) <= quoted and len(caller_lines("URX,UF")) == 29
    (uc,) = caller_lines("UC")
    cut = cuts[0]
    assert cut["access_log"] == [uc] and cut["flow"]["server"] == POD
    fin = cut["evidence"][0]
    assert fin["flags"] == "F." and fin["src"] == POD and fin["payload_len"] == 0
    # the cut is the exit's: after the last accepted connection, before the first refusal
    assert cut["details"]["last_accepted_ts"] - 0.05 <= fin["ts"] <= cut["details"]["exited_by_ts"]


def test_the_recorded_longer_drain_has_no_finding():
    code, report = analyze_json(DATA / "lab-shutdown-drain-longer" / "healthy-caller")
    assert code == 0 and report["findings"] == [], report["findings"]


def served(w: Wire, client: str, tls: bool = True) -> None:
    """One connection the pod's sidecar accepted and served: handshake, a ServerHello (mTLS), closed."""
    w.pkt(client, POD, S, 100)
    w.pkt(POD, client, S | A, 5000, 101, dt=0.0001)
    w.pkt(client, POD, A, 101, 5001, dt=0.0001)
    if tls:
        w.pkt(POD, client, P | A, 5001, 101, tls=bytes.fromhex("160303007a020000760303") + bytes(118), dt=0.0001)
    w.pkt(client, POD, F | A, 300, 6000, dt=0.01)


def refused(w: Wire, client: str, dt: float = 0.1) -> None:
    w.pkt(client, POD, S, 900, dt=dt)
    w.pkt(POD, client, R | A, 0, 901, dt=0.0001)


def test_a_sidecar_port_refusing_after_it_served_is_named():
    w = Wire(iface="eth0")
    served(w, f"{CALLER}:40000")
    refused(w, f"{CALLER}:40001")
    found = run(w.events)
    assert [f.detector for f in found] == ["shutdown-ordering"] and found[0].envoy_flags == ("UF", "URX")


def test_no_finding_without_a_sidecar_sign_or_without_an_earlier_accept():
    w = Wire(iface="eth0")
    served(w, f"{CALLER}:40000", tls=False)  # plaintext, no Envoy field: not known to be a sidecar
    refused(w, f"{CALLER}:40001")
    assert not [f for f in run(w.events) if f.detector == "shutdown-ordering"]
    w = Wire(iface="eth0")
    refused(w, f"{CALLER}:40001")  # never accepted: a refusal from the start is another story
    assert not [f for f in run(w.events) if f.detector == "shutdown-ordering"]


def test_refusals_on_lo_are_left_to_startup_ordering():
    w = Wire(iface="lo")
    served(w, f"{CALLER}:40000")
    refused(w, f"{CALLER}:40001")
    assert not [f for f in run(w.events) if f.detector == "shutdown-ordering"]


def test_the_fixes_are_the_proven_ones():
    assert [f.name for f in shutdown_ordering.FIXES] == ["native-sidecar", "termination-drain"]
    assert dict(shutdown_ordering.FIXES[1].annotations)["proxy.istio.io/config"] == "terminationDrainDuration: 20s"
