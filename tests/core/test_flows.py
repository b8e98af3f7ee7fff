from kubectl_meshdoctor.core.flows import FlowState, FlowTable

from ..helpers import A, F, R, S, Wire


def test_handshake_then_fin_both_ways_closes():
    w = Wire()
    w.handshake("198.18.0.1:40000", "198.18.0.2:80")
    w.pkt("198.18.0.1:40000", "198.18.0.2:80", F | A, 1001, 5001)
    w.pkt("198.18.0.2:80", "198.18.0.1:40000", F | A, 5001, 1002)
    t = FlowTable()
    states = [t.observe(ev).state for ev in w.events]
    assert states == [FlowState.SYN_SENT, FlowState.ESTABLISHED, FlowState.ESTABLISHED, FlowState.CLOSING,
                      FlowState.CLOSED]
    assert len(t) == 1 and t.get("eth0", ("198.18.0.1", 40000), ("198.18.0.2", 80)).client == ("198.18.0.1", 40000)


def test_midstream_pickup_guesses_the_ephemeral_side_as_client():
    w = Wire()
    ev = w.pkt("198.18.0.2:5000", "198.18.0.1:43210", A, 1, 1, payload_len=5)
    f = FlowTable().observe(ev)
    assert f.client == ("198.18.0.1", 43210) and f.state is FlowState.ESTABLISHED


def test_size_cap_and_idle_expiry_keep_the_table_bounded():
    t = FlowTable(idle_s=5.0, closed_idle_s=1.0, max_flows=100)
    w = Wire()
    for i in range(1000):
        t.observe(w.pkt(f"198.18.0.1:{20000 + i}", "198.18.0.2:80", S, i, dt=0.001))
    assert len(t) <= 100
    t.observe(w.pkt("198.18.0.9:1", "198.18.0.2:80", S, 1, dt=10.0))
    t.sweep(w.t)
    assert len(t) == 1


def test_reset_flow_is_replaced_by_a_new_syn_and_marked_reused():
    w = Wire()
    w.handshake("198.18.0.1:40000", "198.18.0.2:80")
    w.pkt("198.18.0.1:40000", "198.18.0.2:80", R, 1001)
    t = FlowTable()
    for ev in w.events:
        t.observe(ev)
    f = t.observe(w.pkt("198.18.0.1:40000", "198.18.0.2:80", S, 77))
    assert f.reused_closed and f.state is FlowState.SYN_SENT
