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
        assert f["details"]["last_accepted"]["ts"] < f["details"]["exited_by"]["ts"] <= rst["ts"]
        assert f["details"]["sidecar_seen"]["ts"] < f["details"]["last_accepted"]["ts"]  # its ServerHello
        assert [x["name"] for x in f["fixes"]] == ["native-sidecar", "termination-drain"]
    # every 503 URX,UF the caller logged is quoted by a refusal; its 503 UC by the connection the exit cut
    # (a line that names no connection, a failed connect's, is held to packets within core/correlate.py's
    # UNPINNED_WINDOW_S: with calls 0.1 s apart a neighbour's line is quoted too)
    quoted = {line for f in refusals for line in f.get("access_log", [])}
    assert quoted == set(caller_lines("URX,UF")) and len(quoted) == 27
    (uc,) = caller_lines("UC")
    cut = cuts[0]
    assert cut["access_log"] == [uc] and cut["flow"]["server"] == POD
    fin = cut["evidence"][0]
    assert fin["flags"] == "F." and fin["src"] == POD and fin["payload_len"] == 0
    # the cut is the exit's: after the last accepted connection, before the first refusal
    assert cut["details"]["last_accepted"]["ts"] - 0.05 <= fin["ts"] <= cut["details"]["exited_by"]["ts"]


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


def plain(w: Wire, client: str, close_asked: bool, drain: bool) -> None:
    """A plaintext HTTP/1.1 call the sidecar answers (Envoy's x-envoy-upstream-service-time), with the drain's
    ``connection: close`` when ``drain``."""
    w.pkt(client, POD, S, 100)
    w.pkt(POD, client, S | A, 5000, 101, dt=0.0001)
    asked = b"Connection: close\r\n" if close_asked else b""
    w.pkt(client, POD, P | A, 101, 5001, http=b"GET / HTTP/1.1\r\nHost: pod\r\n" + asked + b"\r\n")
    told = b"connection: close\r\n" if drain or close_asked else b""
    w.pkt(POD, client, P | A, 5001, 130, http=b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
          b"x-envoy-upstream-service-time: 1\r\n" + told + b"\r\nok")


def test_the_drain_is_the_connection_close_of_a_keep_alive_request():
    w = Wire(iface="eth0")
    plain(w, f"{CALLER}:40000", close_asked=False, drain=False)
    plain(w, f"{CALLER}:40002", close_asked=False, drain=True)
    plain(w, f"{CALLER}:40004", close_asked=False, drain=True)
    refused(w, f"{CALLER}:40006")
    (f,) = [f for f in run(w.events) if f.detector == "shutdown-ordering"]
    assert f.details["drain"]["responses"] == 2 and f.details["drain"]["frame"] == 8  # the first told to go
    w = Wire(iface="eth0")
    plain(w, f"{CALLER}:40000", close_asked=True, drain=False)  # the caller asked for the close itself
    refused(w, f"{CALLER}:40006")
    (f,) = [f for f in run(w.events) if f.detector == "shutdown-ordering"]
    assert "drain" not in f.details


def test_the_recorded_plaintext_drain_and_exit():
    """The same shutdown with a plaintext caller (no caller sidecar): the drain's connection: close shows."""
    code, report = analyze_json(DATA / "lab-shutdown-plain" / "healthy")
    found = [f for f in report["findings"] if f["detector"] == "shutdown-ordering"]
    assert code == 1 and found
    drain = found[0]["details"]["drain"]
    # pilot-agent's terminationDrainDuration (5 s) between the first connection: close and the exit, each
    # response told to go meanwhile
    assert 4.0 < drain["seconds"] < 5.5 and drain["responses"] >= 30, drain
    cuts = [f for f in found if f["envoy_flags"] == ["UC"]]
    # at the kill: the slow request's connection (FIN) and one the kernel had queued for Envoy (RST)
    assert sorted(f["evidence"][0]["flags"] for f in cuts) == ["F.", "R."], cuts


def test_a_sidecar_back_after_an_exit_starts_a_new_timeline():
    w = Wire(iface="eth0")
    served(w, f"{CALLER}:40000")
    refused(w, f"{CALLER}:40001")
    first_exit = w.frame
    served(w, f"{CALLER}:40002")  # istio-proxy restarted: it accepts (and speaks mTLS) again
    refused(w, f"{CALLER}:40003")
    found = [f for f in run(w.events) if f.detector == "shutdown-ordering"]
    assert [f.details["exited_by"]["frame"] for f in found] == [first_exit, w.frame]
    assert found[1].details["last_accepted"]["frame"] > first_exit


def test_the_pod_s_sidecar_runs_are_quoted_as_watch_read_them_at_its_start_and_end():
    """The pod as watch read it: istio-proxy killed once before (lastState exit 137) and the kubelet's events of
    its runs (kube/pod_events.py); read again at the end, the kubelet's Killing of the exit watched and its end
    (exit 0: pilot-agent's after its drain). The finding quotes all, each once (core/pod_history.py)."""
    from dataclasses import replace

    from kubectl_meshdoctor.core.events import ContainerEvent, ContainerExit, PodEvent
    from kubectl_meshdoctor.core.pipeline import Pipeline

    w = Wire(iface="eth0")
    served(w, f"{CALLER}:40000")
    refused(w, f"{CALLER}:40001")
    t = w.events[0].ts
    pod = PodEvent(t - 100, "web", 0, sidecar_restarts=1, sidecar_started=t - 50,
                   sidecar_last_exit=ContainerExit(t - 51, 137, "Error"),
                   history=(ContainerEvent(t - 50, "istio-proxy", "Started", "Started container istio-proxy"),),
                   ips=(POD.split(":")[0],))
    # watched from the caller's pod, the refusing port is a peer's: the caller's own status is no evidence of it
    p = Pipeline.with_detectors(only=["shutdown-ordering"], pod="caller")
    p.context(replace(pod, name="caller", ips=(CALLER,)))
    for ev in w.events:
        p.feed(ev)
    (f,) = p.finish()
    assert not [e for e in f.evidence if e.kind == "spec"], f.evidence
    p = Pipeline.with_detectors(only=["shutdown-ordering"], pod="web")
    p.context(pod)
    for ev in w.events:
        p.feed(ev)
    # the pod read again as the watch ends: the kubelet's Killing of this exit, and its end in lastState
    exit_ts = w.events[-1].ts
    killing = ContainerEvent(exit_ts - 5, "istio-proxy", "Killing", "Stopping container istio-proxy")
    p.context(replace(pod, sidecar_last_exit=ContainerExit(exit_ts, 0, "Completed"), history=(*pod.history, killing)))
    (f,) = p.finish()
    spec = [e.what for e in f.evidence if e.frame is None]
    assert any(s.startswith("status.containerStatuses[istio-proxy].lastState.terminated = exitCode 137") for s in spec)
    assert any(s.startswith("status.containerStatuses[istio-proxy].lastState.terminated = exitCode 0, reason "
                            "Completed") for s in spec), spec
    assert sum(s.startswith("event Started (istio-proxy") for s in spec) == 1, spec  # not quoted twice
    assert any(s.startswith("event Killing (istio-proxy") for s in spec), spec
    assert "killed by SIGKILL" in f.explanation


def test_a_connection_cut_in_its_tls_handshake_is_the_callers_connect_failure_not_a_request_reset():
    """lab-shutdown-handshake-cut: the kill came as a call's connection had sent its ClientHello and nothing
    more (the RST acknowledges its last byte). The caller's sidecar met a connect failure, retried it, was refused,
    and logged 503 URX,UF: no request of that connection was in flight, so it is no 503 UC. The slow request's
    connection, cut with its request in flight, is still the one UC."""
    import dpkt

    data = DATA / "lab-shutdown-handshake-cut"
    code, report = analyze_json(data / "healthy", data / "healthy-caller")
    found = report["findings"]
    assert code == 1 and {f["detector"] for f in found} == {"shutdown-ordering"}
    by_variant: dict[str, list[dict]] = {}
    for f in found:
        by_variant.setdefault(f["variant"], []).append(f)
    (uc,) = by_variant["connection closed by the sidecar's exit"]
    assert uc["envoy_flags"] == ["UC"] and [" 503 UC " in line and "/slow/" in line for line in uc["access_log"]] \
        == [True]
    (cut,) = by_variant["TLS handshake cut by the sidecar's exit"]
    hello, close = cut["evidence"][:2]
    assert cut["envoy_flags"] == ["UF", "URX"] and hello["record"] == "ClientHello"
    assert (hello["src"], hello["dst"]) == (close["dst"], close["src"]) == (cut["flow"]["client"], POD)
    # the rule read again from the file by another reader: the close's ACK is the ClientHello record's end
    with open(data / "healthy" / "eth0.pcap", "rb") as fh:
        tcp = {n: dpkt.ethernet.Ethernet(buf).data.data for n, (_, buf) in enumerate(dpkt.pcap.Reader(fh), 1)}
    first = tcp[hello["frame"]]
    assert tcp[close["frame"]].ack == first.seq + 5 + int.from_bytes(first.data[3:5], "big")
    # the call whose connect it was: retried, refused, logged as URX,UF at the cut's time
    line = next(iter(cut["access_log"]))
    assert " 503 URX,UF " in line and "delayed_connect_error:_Connection_refused" in line
