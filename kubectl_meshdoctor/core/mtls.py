"""What a connection's TLS handshake tells without keys: an Istio mTLS hop's service, port and protocol.

A sidecar originating Istio mTLS puts the upstream cluster's DNS SRV key in the ClientHello's SNI,
``outbound_.PORT_.SUBSET_.HOST`` (the subset empty for none: ``outbound_.5000_._.reviews.shop.svc.cluster.local``;
istio/istio pilot/pkg/model/service.go, BuildDNSSrvSubsetKey, "the default SNI string for Istio mTLS
connections"), and Istio's ALPN in front of the application's (``istio-http/1.1``, ``istio-h2``, ``istio`` for
HTTP; ``istio-peer-exchange``, ``istio`` for TCP). Detectors keep a connection's ClientHello with ``remember_hello``
and cite it with ``hello_evidence``, so a finding on an encrypted eth0 connection names what it was for.
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import PacketEvent, TlsStart
from .findings import Evidence
from .flows import Flow

HELLO_NOTE = "mtls.client-hello"  # the flow note that holds the connection's ClientHello (a PacketEvent)


@dataclass(frozen=True, slots=True)
class IstioSni:
    """An Istio mTLS SNI read back: ``direction`` (``outbound``), ``port``, ``subset`` ("" for none), ``host``
    (the service's FQDN)."""

    direction: str
    port: int
    subset: str
    host: str


def istio_sni(sni: str | None) -> IstioSni | None:
    """``outbound_.PORT_.SUBSET_.HOST`` as its parts (BuildDNSSrvSubsetKey), or None for another name."""
    parts = (sni or "").split("_.", 3)
    if len(parts) != 4 or parts[0] not in ("outbound", "inbound") or not parts[1].isdigit() or not parts[3]:
        return None
    return IstioSni(parts[0], int(parts[1]), parts[2], parts[3])


def hello_text(tls: TlsStart) -> str:
    """``ClientHello SNI outbound_.5000_._.x.ns.svc.cluster.local ALPN istio-http/1.1,istio`` and, for Istio's
    SNI, what it names: `` (Istio mTLS to x.ns.svc.cluster.local port 5000)``; a hello cut short by its segment
    says so."""
    text = tls.describe()
    sni = istio_sni(tls.sni)
    if sni is not None:
        subset = f" subset {sni.subset}" if sni.subset else ""
        text += f" (Istio mTLS to {sni.host} port {sni.port}{subset})"
    elif not tls.complete:
        text += " (cut short by its segment: no SNI or ALPN read)"
    return text


def remember_hello(ev: PacketEvent, flow: Flow) -> None:
    """Keep ``ev`` in the flow's notes if it is the connection's first ClientHello (bounded with the flow)."""
    if ev.tls is not None and ev.tls.is_client_hello and HELLO_NOTE not in flow.notes:
        flow.notes[HELLO_NOTE] = ev


def hello_of(flow: Flow) -> PacketEvent | None:
    """The connection's ClientHello packet, if one was remembered."""
    return flow.notes.get(HELLO_NOTE)


def hello_evidence(flow: Flow) -> tuple[Evidence, ...]:
    """The connection's ClientHello as evidence naming its SNI and ALPN: one item, or none without a hello."""
    hello = hello_of(flow)
    return (Evidence.of(hello, hello_text(hello.tls)),) if hello is not None and hello.tls is not None else ()
