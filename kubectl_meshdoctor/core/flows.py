"""The flow table: TCP connections keyed by interface and four-tuple, bounded in size and age.

Memory must stay flat on endless captures (docs/DESIGN.md, performance budget), so flows expire after an idle
time measured in packet time (offline files replay faster than wall time) and the table is capped; the least
recently seen flow goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from .events import PacketEvent, RedirectMap

Endpoint = tuple[str, int]
FlowKey = tuple[str, Endpoint, Endpoint]  # (iface, client, server)


class FlowState(str, Enum):
    SYN_SENT = "syn-sent"
    ESTABLISHED = "established"
    CLOSING = "closing"  # a FIN was seen from one side
    CLOSED = "closed"  # FIN from both sides
    RESET = "reset"

    @property
    def live(self) -> bool:
        """Whether a socket may still hold this four-tuple (the kernel keeps it until close completes)."""
        return self in (FlowState.SYN_SENT, FlowState.ESTABLISHED, FlowState.CLOSING)


@dataclass(slots=True)
class Flow:
    """One TCP connection as seen on one interface. Times are seconds since the epoch."""

    iface: str
    client: Endpoint
    server: Endpoint
    first_ts: float
    last_ts: float
    state: FlowState
    syn_seen: bool = False
    packets: int = 0
    first_frame: int = 0
    source: str = ""
    reused_closed: bool = False  # this SYN reused the four-tuple of a flow seen closed or reset (TIME_WAIT reuse)
    client_fin: bool = False
    server_fin: bool = False
    notes: dict = field(default_factory=dict)  # small per-detector annotations, dropped with the flow

    @property
    def key(self) -> FlowKey:
        return (self.iface, self.client, self.server)


_SYN_SENT, _ESTABLISHED, _CLOSING, _CLOSED, _RESET = (FlowState.SYN_SENT, FlowState.ESTABLISHED, FlowState.CLOSING,
                                                      FlowState.CLOSED, FlowState.RESET)


def _guess_client(ev: PacketEvent) -> tuple[Endpoint, Endpoint]:
    """Client and server of a connection picked up mid-stream: the SYN tells, else the higher (ephemeral) port."""
    a, b = (ev.src, ev.sport), (ev.dst, ev.dport)
    if ev.is_syn:
        return a, b
    if ev.is_syn_ack:
        return b, a
    return (a, b) if ev.sport >= ev.dport else (b, a)


class FlowTable:
    """Bounded table of flows.

    ``idle_s``: a live flow unseen for this many seconds (packet time) is dropped; ``closed_idle_s`` the same for
    closed and reset flows (they matter only briefly, e.g. a retransmission after RST); ``max_flows`` caps the
    table. ``observe`` must be called once per packet, in capture order per interface.
    """

    def __init__(self, idle_s: float = 300.0, closed_idle_s: float = 10.0, max_flows: int = 100_000) -> None:
        self.idle_s = idle_s
        self.closed_idle_s = closed_idle_s
        self.max_flows = max_flows
        self._flows: OrderedDict[FlowKey, Flow] = OrderedDict()
        self._by_client: dict[tuple[str, Endpoint], set[FlowKey]] = {}
        self._since_sweep = 0
        self.expired = 0
        # Flows the table grew by (stats.flows_seen): a four-tuple reused after close replaces its old flow and is
        # not counted again, nor a flow inserted as a sweep made room.
        self.counted = 0
        self._peers_memo: tuple | None = None  # (event, redirect map, its redirect peers) until the next observe

    def __len__(self) -> int:
        return len(self._flows)

    def get(self, iface: str, a: Endpoint, b: Endpoint) -> Flow | None:
        """The flow between endpoints ``a`` and ``b`` on ``iface``, in either direction."""
        return self._flows.get((iface, a, b)) or self._flows.get((iface, b, a))

    def observe(self, ev: PacketEvent) -> Flow:
        """Update the table with one packet and return its flow (new or existing)."""
        # Once a packet, ~a sixth of the detectors' process: locals, plain int tests (see PacketEvent.is_syn),
        # the client side compared only where a FIN or the handshake's last ACK needs it.
        self._peers_memo = None
        flows = self._flows
        before = len(flows)
        iface = ev.iface
        a, b = (ev.src, ev.sport), (ev.dst, ev.dport)
        flags = ev.flags._value_
        syn = flags & 0x12 == 0x02
        key = (iface, a, b)
        flow = flows.get(key)
        if flow is None:
            key = (iface, b, a)
            flow = flows.get(key)
        reused = False
        if flow is not None and syn and not flow.state.live:
            # A new connection reusing the four-tuple after close (TIME_WAIT reuse): a new flow.
            self._remove(key)
            flow, reused = None, True
        if flow is None:
            client, server = _guess_client(ev)
            flow = Flow(iface, client, server, ev.ts, ev.ts, _SYN_SENT if syn else _ESTABLISHED, syn_seen=syn,
                        first_frame=ev.frame, source=ev.source, reused_closed=reused)
            self._insert(flow)
        else:
            flows.move_to_end(key)
        if ev.ts > flow.last_ts:
            flow.last_ts = ev.ts
        flow.packets += 1
        if flags & 0x04:  # RST
            flow.state = _RESET
        elif flags & 0x12 == 0x12 and flow.state is _SYN_SENT:  # SYN-ACK
            flow.state = _ESTABLISHED
        elif flags & 0x01:  # FIN
            if a == flow.client:
                flow.client_fin = True
            else:
                flow.server_fin = True
            flow.state = _CLOSED if flow.client_fin and flow.server_fin else _CLOSING
        elif flow.state is _SYN_SENT and not syn and flags & 0x10 and a == flow.client:
            flow.state = _ESTABLISHED
        self._since_sweep += 1
        if self._since_sweep >= 1024 or len(flows) > self.max_flows:
            self.sweep(ev.ts)
        if len(flows) > before:
            self.counted += 1
        return flow

    def live_flows_of_client(self, iface: str, client: Endpoint) -> list[Flow]:
        """Live flows on ``iface`` whose client endpoint is ``client`` (ip, port)."""
        keys = self._by_client.get((iface, client), ())
        return [f for k in keys if (f := self._flows.get(k)) is not None and f.state.live]

    def redirect_peers(self, ev: PacketEvent, redirect_map: RedirectMap) -> list[Flow]:
        """Live flows that share ``ev``'s client ip:port and whose server port REDIRECTs to the same listener.

        These are the connections a new SYN collides with after Istio's REDIRECT: both map to
        (pod, listener port, client ip, client port), one four-tuple for two connections.
        """
        memo = self._peers_memo  # two detectors ask for every SYN, with nothing observed in between
        if memo is not None and memo[0] is ev and memo[1] is redirect_map:
            return list(memo[2])
        listener = redirect_map.listener_for(ev.dport)
        peers = [] if listener is None else [
            f
            for f in self.live_flows_of_client(ev.iface, (ev.src, ev.sport))
            if f.server[0] == ev.dst and f.server[1] != ev.dport and redirect_map.listener_for(f.server[1]) == listener
        ]
        self._peers_memo = (ev, redirect_map, peers)
        return list(peers)

    def sweep(self, now: float) -> int:
        """Drop idle flows (packet time ``now``, seconds) and enforce the size cap; returns how many went."""
        self._since_sweep = 0
        # The dict is in last-seen order, so the scan can stop at the first flow younger than the shorter timeout.
        gone = []
        for k, f in self._flows.items():
            age = now - f.last_ts
            if age <= self.closed_idle_s:
                break
            if age > (self.idle_s if f.state.live else self.closed_idle_s):
                gone.append(k)
        for k in gone:
            self._remove(k)
        while len(self._flows) > self.max_flows:
            self._remove(next(iter(self._flows)))
            gone.append(None)
        self.expired += len(gone)
        return len(gone)

    def _insert(self, flow: Flow) -> None:
        self._flows[flow.key] = flow
        self._by_client.setdefault((flow.iface, flow.client), set()).add(flow.key)

    def _remove(self, key: FlowKey) -> None:
        flow = self._flows.pop(key, None)
        if flow is None:
            return
        idx = self._by_client.get((flow.iface, flow.client))
        if idx is not None:
            idx.discard(key)
            if not idx:
                del self._by_client[(flow.iface, flow.client)]
