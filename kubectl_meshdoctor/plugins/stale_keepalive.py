"""``stale-keepalive``: Envoy reuses a pooled upstream connection the app has just closed.

The app closes an idle keep-alive connection (FIN) while Envoy, which has not read that FIN yet, writes the next
request on it. The app's socket is gone, so its kernel answers the data with RST (RFC 9293 section 3.6.1: data to
a closed socket). Envoy answers the caller 503 with response flag UC and details
``upstream_reset_before_response_started{connection_termination}``. Seen on ``lo``, between 127.0.0.6 and the
app port.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..detectors import Detector
from ..events import PacketEvent
from ..findings import Evidence, Finding, FlowRef, Severity
from ..flows import Flow
from ..remedies import destination_rule_pool, virtual_service_retries

RACE_WINDOW_S = 0.05  # a request this much before the FIN crossed it on the wire: the same race
_NOTE = "stale-keepalive"

_REMEDIATION = (
    "# Let Envoy close pooled connections before the app does: idleTimeout shorter than the app's keep-alive\n"
    "# timeout (e.g. app 60 s -> 50 s), and retry the requests that still hit a closing connection:\n"
    + destination_rule_pool("http", "idleTimeout", "50s", "< the app's keep-alive timeout")
    + "\n---\n" + virtual_service_retries(2, "reset,connect-failure"))


class StaleKeepalive(Detector):
    id = "stale-keepalive"

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "lo":
            return ()
        from_server = (ev.src, ev.sport) == flow.server
        # Per-flow notes live and die with the flow in the bounded flow table.
        note = flow.notes.setdefault(_NOTE, {"fin": None, "last_request": None, "reported": False})
        if note["reported"]:
            return ()
        if from_server:
            if ev.is_rst:
                return self._on_reset(ev, flow, note)
            if ev.is_fin and note["fin"] is None:
                note["fin"] = ev
            if ev.payload_len:
                note["last_request"] = None  # answered: an earlier request was not in the race
        elif ev.payload_len and not ev.is_rst:
            note["last_request"] = ev
        return ()

    def _on_reset(self, rst: PacketEvent, flow: Flow, note: dict) -> Iterable[Finding]:
        fin, req = note["fin"], note["last_request"]
        if fin is None or req is None or req.ts < fin.ts - RACE_WINDOW_S:
            return ()
        note["reported"] = True
        after = req.ts >= fin.ts
        gap_ms = abs(req.ts - fin.ts) * 1000
        when = f"{gap_ms:.1f} ms after" if after else f"{gap_ms:.1f} ms before (crossing)"
        ref = FlowRef.of(flow)
        return (Finding(
            detector=self.id,
            severity=Severity.ERROR,
            title=f"Request on a keep-alive connection the app had closed: {ref.server} reset it",
            flow=ref,
            evidence=(Evidence.of(fin, "FIN from the app (idle keep-alive close)"),
                      Evidence.of(req, f"request from the sidecar, {when} the FIN"),
                      Evidence.of(rst, "RST from the app: the socket is gone")),
            envoy_flags=("UC",),
            explanation=(
                f"The app at {ref.server} closed this pooled connection (FIN) and the sidecar ({ref.client}) wrote "
                f"the next request on it {when} that FIN; the app's kernel answered with RST because no socket "
                f"is left to read it (RFC 9293 section 3.6.1). Envoy answers the caller 503 with response flag UC "
                f"and details upstream_reset_before_response_started{{connection_termination}}. The app's "
                f"keep-alive timeout is shorter than Envoy's idle timeout for this cluster (1 h by default)."),
            remediation=_REMEDIATION,
            pod=self.ctx.pod,
            ts=rst.ts,
            response_code_details="upstream_reset_before_response_started{connection_termination}",
            details={"request_after_fin_ms": round((req.ts - fin.ts) * 1000, 3)},
        ),)
