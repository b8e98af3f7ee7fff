"""The TLS record at the start of one TCP segment's payload: what an mTLS hop shows without its keys.

Between two sidecars eth0 carries TLS 1.3 (Istio mTLS). Without keys a capture still shows the ClientHello in
the clear (its SNI names the service and port, ``outbound_.PORT_._.SERVICE.NAMESPACE.svc.cluster.local``, and
its ALPN the protocol, ``istio-http/1.1``, ``istio-h2``, ``istio-peer-exchange``, ``istio``), the ServerHello,
plaintext alerts, and the shape of TLS 1.3's encrypted alert: an application-data record of 19 bytes, a 2-byte
alert, its 1-byte inner content type and a 16-byte AEAD tag (RFC 8446 sections 5.1, 5.2 and 6; close_notify is
what Envoy sends when it closes a connection). Every other record is application data and is not read.

Sources: RFC 8446 section 5.1 (the record header: type, legacy_record_version, length), section 4 (the handshake
header: type, 24-bit length), RFC 6066 section 3 (server_name), RFC 7301 section 3.1
(application_layer_protocol_negotiation), RFC 8446 section 4.2.1 (supported_versions). The hello's fixed part
and its extension list are read by dpkt (``dpkt.ssl.TLSClientHello``, ``parse_extensions``).
"""

from __future__ import annotations

import struct

from kubectl_meshdoctor.core.events import (ALERT, APPLICATION_DATA, CLIENT_HELLO, ENCRYPTED_ALERT_LENGTH, HANDSHAKE,
                                            SERVER_HELLO, TlsStart)

# What capture filters look for at the start of a payload (sources/tshark.py's prefilter, live/pod_script.py's
# BPF, sources/prepass.py): a handshake or an alert record of any TLS version (the second byte is always 3), and
# the one application-data record that is read, TLS 1.3's encrypted alert (version 0x0303, length 19).
RECORD_PREFIXES = (bytes((HANDSHAKE, 3)), bytes((ALERT, 3)),
                   bytes((APPLICATION_DATA, 3, 3)) + ENCRYPTED_ALERT_LENGTH.to_bytes(2, "big"))
_HEX_PREFIXES = tuple(p.hex() for p in RECORD_PREFIXES)
TLS_BYTES_READ = 5 + 2 ** 14  # a TLS record's header and its largest plaintext body (RFC 8446 section 5.1)

_SERVER_NAME, _ALPN, _SUPPORTED_VERSIONS = 0, 16, 43  # extension types (IANA TLS ExtensionType values)
_HOST_NAME = 0  # the NameType of a DNS host name (RFC 6066 section 3)
_MAX_RECORD = 2 ** 14 + 2048  # a TLSCiphertext's largest length (RFC 8446 section 5.2)


def _text(raw: bytes) -> str:
    """A name from the wire as visible ASCII: a host name (RFC 6066 section 3) and a protocol id (RFC 7301 section
    6) are that; any other byte shows as ``?``, so a name never carries a control byte into a screen or report."""
    return "".join(chr(b) if 0x21 <= b <= 0x7E else "?" for b in raw)


def starts_tls_record(hex_payload: str) -> bool:
    """Whether tshark's hex of a payload (no separators) begins one of the records read here."""
    return hex_payload.startswith(_HEX_PREFIXES)


def _server_name(body: bytes) -> str | None:
    """The host_name of a server_name extension (RFC 6066 section 3: a 2-byte list length, then entries of a
    1-byte type and a 2-byte length), or None."""
    if len(body) < 2:
        return None
    end = min(len(body), 2 + int.from_bytes(body[:2], "big"))
    at = 2
    while at + 3 <= end:
        kind, size = body[at], int.from_bytes(body[at + 1:at + 3], "big")
        name = body[at + 3:at + 3 + size]
        if kind == _HOST_NAME and len(name) == size:
            return _text(name)
        at += 3 + size
    return None


def _protocols(body: bytes) -> tuple[str, ...]:
    """The protocol names of an ALPN extension (RFC 7301 section 3.1: a 2-byte list length, then 1-byte
    length-prefixed names), in the sender's order."""
    if len(body) < 2:
        return ()
    end = min(len(body), 2 + int.from_bytes(body[:2], "big"))
    at, names = 2, []
    while at < end:
        size = body[at]
        name = body[at + 1:at + 1 + size]
        if not size or len(name) != size:
            break
        names.append(_text(name))
        at += 1 + size
    return tuple(names)


def _selected_version(body: bytes) -> int | None:
    """A ServerHello's supported_versions (RFC 8446 section 4.2.1: the one version it selected)."""
    return int.from_bytes(body, "big") if len(body) == 2 else None


def _hello(handshake_type: int, body: bytes) -> tuple[str | None, tuple[str, ...], int | None]:
    """(SNI, ALPN, selected version) of a whole ClientHello or ServerHello body (after the 4-byte handshake
    header). Raises what dpkt raises on bytes that are not one."""
    import dpkt.ssl

    hello = (dpkt.ssl.TLSClientHello if handshake_type == CLIENT_HELLO else dpkt.ssl.TLSServerHello)(body)
    sni, alpn, version = None, (), None
    for ext_type, ext in getattr(hello, "extensions", ()):
        if ext_type == _SERVER_NAME and sni is None:
            sni = _server_name(ext)
        elif ext_type == _ALPN and not alpn:
            alpn = _protocols(ext)
        elif ext_type == _SUPPORTED_VERSIONS and handshake_type == SERVER_HELLO:
            version = _selected_version(ext)
    return sni, alpn, version


def parse_tls_start(payload: bytes) -> TlsStart | None:
    """The TLS record that ``payload`` (a TCP segment's bytes) begins with, if it is one of those read here: a
    handshake record (a ClientHello's SNI and ALPN, a ServerHello's selected version and ALPN, when the whole
    hello is in the segment), a plaintext alert (its level and description), or TLS 1.3's encrypted alert
    (application data of length 19). None for anything else. Never raises."""
    if len(payload) < 5 or payload[1] != 3 or not payload.startswith(RECORD_PREFIXES):
        return None
    content_type, version, length = payload[0], int.from_bytes(payload[1:3], "big"), int.from_bytes(payload[3:5],
                                                                                                     "big")
    if length == 0 or length > _MAX_RECORD:
        return None
    body = payload[5:5 + length]
    if content_type == ALERT:
        alert = (body[0], body[1]) if length == 2 and len(body) == 2 else None
        return TlsStart(content_type, version, length, alert=alert)  # length != 2: an encrypted (TLS 1.2) alert
    if content_type == APPLICATION_DATA:
        return TlsStart(content_type, version, length)
    if len(body) < 4:
        return TlsStart(content_type, version, length, complete=False)
    handshake_type, size = body[0], int.from_bytes(body[1:4], "big")
    if handshake_type not in (CLIENT_HELLO, SERVER_HELLO):
        # TLS 1.2's encrypted Finished, or another message: the record's type says enough
        return TlsStart(content_type, version, length, handshake_type=handshake_type)
    whole = len(body) >= 4 + size
    sni, alpn, selected = None, (), None
    if whole:
        import dpkt  # here: only a capture with a hello pays for the import (3.5 MB)

        try:
            sni, alpn, selected = _hello(handshake_type, body[4:4 + size])
        except (dpkt.Error, struct.error, ValueError, IndexError, TypeError, AssertionError):
            whole = False  # bytes that only look like a hello
    return TlsStart(content_type, version, length, handshake_type=handshake_type, sni=sni, alpn=alpn,
                    selected_version=selected, complete=whole)
