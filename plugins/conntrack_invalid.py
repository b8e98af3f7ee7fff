"""``conntrack-invalid``: a segment of a live inbound connection that conntrack marks INVALID skips Istio's REDIRECT
and reaches the app's own port, whose kernel resets the connection.

Istio's inbound capture is a nat-table REDIRECT (PREROUTING, ISTIO_IN_REDIRECT to 15006). The nat table sees only
packets conntrack tracks; a segment conntrack finds out of the connection's window (its sequence number past what
the receiver advertised: ``tcp_in_window``, net/netfilter/nf_conntrack_proto_tcp.c, with
``nf_conntrack_tcp_be_liberal`` 0, the default) is INVALID, counted in ``conntrack -S``'s ``invalid``, and
delivered un-NATed: to the app's port P, where no socket owns the four-tuple (the connection's socket is the
sidecar's, on 15006). The app's listener answers with an RST whose sequence number is the segment's ACK and which
carries no ACK flag (RFC 9293 section 3.10.7.1; Linux ``tcp_v4_send_reset``). On the pod's ``eth0`` that RST has
the live connection's own four-tuple (the sidecar's packets leave de-NATed as P too), and its sequence number is
the one the caller expects next: the caller's kernel accepts it and resets the connection. The sidecar's own
socket never hears of it.

Seen in the lab with real Envoy 1.40 at both hops (Istio mTLS, a caller sidecar): an out-of-window ACK written
into a live upload's connection from the caller's pod. The pod's eth0 shows that segment and, 18 microseconds
later, ``5000 -> port [RST]`` with no ACK flag; conntrack's ``invalid`` counter moves by 2 (the segment, and the
RST itself, which matches no conntrack entry going out). The caller's sidecar logs ``503 UC
upstream_reset_before_response_started{connection_termination}``; the pod's sidecar keeps its half of the
connection open, the request unfinished, and logs nothing until its own timeouts end it.

An established socket that aborts sends RST with ACK (``tcp_send_active_reset``); a socket closed by the pod first
sends its FIN before any RST to late data (stale-keepalive's downstream case). So an RST without ACK from a
captured port, on a connection the pod neither closed nor reset, is a segment that found no socket of the
connection: one that missed the REDIRECT. A lean live capture keeps RSTs, not the pure ACK that caused it; when
the capture holds that segment (the client's, just before, its ACK the RST's sequence number) it is evidence too.

Fix: Istio's ``INVALID_DROP`` proxy metadata (istio/istio tools/istio-iptables/pkg/capture/run.go: a mangle
PREROUTING rule ``-m conntrack --ctstate INVALID -j ISTIO_DROP``, ``ISTIO_DROP -j DROP``): the INVALID segment is
dropped and TCP recovers, or ``net.netfilter.nf_conntrack_tcp_be_liberal=1`` on the node (conntrack stops
judging windows; node-wide).
"""

from __future__ import annotations

from collections.abc import Iterable

from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.flows import Flow

_ACK = 0x10
_NOTE = "conntrack-invalid"
# The kernel answers the stray segment at once (18 us in the lab); a client segment older than this is not its cause.
TRIGGER_WITHIN_S = 1.0
# Client RSTs remembered (tuple-collision's, which reset a live connection through the REDIRECT): half dropped, the
# oldest, when full.
MAX_CLIENT_RSTS = 4096
DETAILS = "upstream_reset_before_response_started{connection_termination}"
# istio/istio manifests/.../injection-template.yaml: proxyMetadata becomes istio-init's environment, and
# tools/istio-iptables/pkg/cmd/root.go reads INVALID_DROP there (the --drop-invalid flag).
INVALID_DROP_CONFIG = 'proxyMetadata:\n  INVALID_DROP: "true"\n'
PROXY_CONFIG = "proxy.istio.io/config"


def fixes() -> tuple[Fix, ...]:
    """Drop the INVALID segment in the pod (Istio's own rule), or stop conntrack judging TCP windows (node-wide)."""
    return (
        Fix("invalid-drop", "have istio-init drop conntrack-INVALID segments before the REDIRECT misses them",
            "the whole mesh; TCP retransmits what was dropped",
            "a pod restart (istio-init writes the rule); with the Istio CNI plugin the same proxyMetadata is read",
            annotations=((PROXY_CONFIG, INVALID_DROP_CONFIG),)),
        Fix("conntrack-be-liberal", "let conntrack accept out-of-window segments",
            "the whole mesh",
            "a node-wide sysctl (every pod's conntrack stops judging TCP windows); a DaemonSet or the node's image",
            yaml="# on each node (or in a privileged DaemonSet): out-of-window segments stay tracked, so they are\n"
                 "# REDIRECTed like the rest of their connection\n"
                 "sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1"),
    )


class ConntrackInvalid(Detector):
    id = "conntrack-invalid"
    # The REDIRECT is in PREROUTING: only a segment arriving on eth0 can miss it (on_packet returns at once on lo).
    unseen_without = {"eth0": "INVALID segments past the REDIRECT"}
    unseen_rank = 40
    # conntrack -S's invalid (/proc/net/stat/nf_conntrack) counts the segment and the RST; nstat's TcpOutRsts the RST.
    kernel_counters = ("ConntrackInvalid", "TcpOutRsts")
    # The calling sidecar's outbound cluster: its connection closed by the peer under the request (the lab's caller).
    envoy_counters = ("upstream_cx_destroy_remote_with_active_rq",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # (client ip, client port, pod ip) -> time of the client's latest RST to any port of the pod: bounded.
        self._client_rsts: dict[tuple[str, int, str], float] = {}

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface == "lo":
            return ()  # the REDIRECT is in PREROUTING: only what arrives on eth0 can miss it
        from_server = (ev.src, ev.sport) == flow.server
        note = flow.notes.get(_NOTE)
        if note is None:  # not setdefault: its default, a new dict, was built at every packet
            note = flow.notes[_NOTE] = {"closed": False, "client": None, "reported": False, "live": False}
        if not ev.is_rst:
            if from_server and ev.is_fin:
                note["closed"] = True  # the pod closed first: late data then finds no socket (not this class)
            elif from_server:
                note["live"] = True  # the pod's side of the connection is seen open in the capture
            else:
                note["client"] = ev
            return ()
        if not from_server:
            note["closed"] = True
            self._remember_client_rst(ev)
            return ()
        stray = not ev.flags._value_ & _ACK and note["live"] and not note["closed"] and not note["reported"]
        note["closed"] = True
        if not stray or self.ctx.redirect_map.listener_for(ev.sport) is None:
            return ()
        if self._client_rsts.get((ev.dst, ev.dport, ev.src), -1.0) >= flow.first_ts:
            # The same client port reset a connection to another port of the pod, which the REDIRECT folds onto
            # this one's four-tuple (tuple-collision): that RST closed this socket, not a missed REDIRECT.
            return ()
        note["reported"] = True
        trigger = note["client"]
        if trigger is not None and (trigger.ack != ev.seq or ev.ts - trigger.ts > TRIGGER_WITHIN_S):
            trigger = None
        return (self._finding(ev, flow, trigger),)

    def _remember_client_rst(self, ev: PacketEvent) -> None:
        if len(self._client_rsts) >= MAX_CLIENT_RSTS:
            oldest = sorted(self._client_rsts.items(), key=lambda kv: kv[1])[:MAX_CLIENT_RSTS // 2]
            for key, _ in oldest:
                del self._client_rsts[key]
        self._client_rsts[(ev.src, ev.sport, ev.dst)] = ev.ts

    def _finding(self, rst: PacketEvent, flow: Flow, trigger: PacketEvent | None) -> Finding:
        ref = FlowRef.of(flow)
        listener = self.ctx.redirect_map.listener_for(rst.sport)
        evidence = [Evidence(flow.source or rst.source, rst.iface, flow.first_frame, flow.first_ts,
                             f"first packet of the live connection {ref.client} -> {ref.server}")] \
            if flow.first_frame and flow.first_frame != rst.frame else []
        if trigger is not None:
            evidence.append(Evidence.of(trigger, f"the caller's segment, seq {trigger.seq}, ack {trigger.ack}: "
                                                 f"answered by the app's port, not the sidecar"))
        evidence.append(Evidence.of(rst, f"RST from the app's port {rst.sport} without ACK, seq {rst.seq}: "
                                         f"no socket of the connection took the segment"))
        seen = ("the caller's segment just before it (its ACK is the RST's sequence number)" if trigger is not None
                else "the segment itself is not in the capture (a lean capture keeps RSTs, not pure ACKs)")
        return Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"RST from the app's port {rst.sport} on a live connection from {ref.client}: a conntrack-INVALID "
                  f"segment bypassed the REDIRECT",
            variant="RST from the app's port on a live redirected connection",
            flow=ref,
            evidence=tuple(evidence),
            envoy_flags=("UC", "DC"),
            response_code_details=DETAILS,
            explanation=(
                f"Istio REDIRECTs port {rst.sport} to the sidecar's {listener} in the nat table of the pod that serves "
                f"{ref.server}, and the nat table sees only segments conntrack tracks. A segment of this live "
                f"connection reached the app's port {rst.sport} instead, where no socket owns the connection, and "
                f"that pod's kernel answered it with an RST without ACK ({seen}); its side had neither closed nor "
                f"reset the connection before. That is what conntrack does with a segment outside the connection's "
                f"window: it marks it INVALID (conntrack -S: invalid), the nat table skips it, and the kernel's RST "
                f"carries the sequence number the caller expects, so the caller's kernel resets the connection. A "
                f"calling sidecar logs 503 UC (connection termination) for the request on it; the sidecar of "
                f"{ref.server} still holds its half and logs the request only when its own timeouts end it (0 DC, or "
                f"a 408). The fixes belong to the pod that serves {ref.server}."),
            fixes=fixes(),
            pod=self.ctx.pod,
            ts=rst.ts,
            details={"rst_seq": rst.seq, "trigger_seen": trigger is not None,
                     **({"trigger_seq": trigger.seq} if trigger is not None else {})},
        )
