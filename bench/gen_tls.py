"""TLS as the mtls mix's eth0 carries it between two sidecars: a TLS 1.3 handshake and encrypted records.

What a capture shows of Istio mTLS without keys (RFC 8446): the client sidecar's ClientHello in a plaintext
handshake record (legacy record version 0x0301, SNI ``outbound_.PORT_._.HOST`` as Istio's BuildDNSSrvSubsetKey
writes it, ALPN in front of the application's: ``istio-http/1.1``/``istio`` for HTTP, ``istio-peer-exchange``/
``istio`` with TCP metadata exchange; istio/istio pilot/pkg/networking/util), the server's ServerHello (TLS 1.3 in
supported_versions), a middlebox-compatibility ChangeCipherSpec each way (RFC 8446 appendix D.4), and from then
on only application-data records (type 23, version 0x0303) whose bodies are ciphertext: the rest of each flight
(EncryptedExtensions, Certificate, CertificateVerify, Finished) and every HTTP/1.1 byte, with AES-GCM's 16-byte
tag and the inner content type byte added (section 5.2).
"""

from __future__ import annotations

import random
import struct

HANDSHAKE, CHANGE_CIPHER_SPEC, APPLICATION_DATA = 22, 20, 23
TLS12, TLS13 = 0x0303, 0x0304
MAX_PLAINTEXT = 16_384  # a record's plaintext at most (RFC 8446 section 5.1)
SEAL_OVERHEAD = 17  # the inner content type byte and the AEAD tag (TLS_AES_128_GCM_SHA256)
X25519 = 0x001D
# BoringSSL's client offer (Envoy's default cipher and group lists): TLS 1.3 suites, then 1.2 ECDHE ones.
CIPHER_SUITES = (0x1301, 0x1302, 0x1303, 0xC02B, 0xC02F, 0xC02C, 0xC030, 0xCCA9, 0xCCA8)
GROUPS = (X25519, 0x0017, 0x0018)
SIG_ALGS = (0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601)
ALPN_HTTP = ("istio-http/1.1", "istio")
ALPN_MXC = ("istio-peer-exchange", "istio")
CCS = struct.pack(">BHHB", CHANGE_CIPHER_SPEC, TLS12, 1, 1)


def record(ctype: int, body: bytes, version: int = TLS12) -> bytes:
    """One TLS record: type, legacy version, length, body (RFC 8446 section 5.1)."""
    return struct.pack(">BHH", ctype, version, len(body)) + body


def _ext(kind: int, data: bytes) -> bytes:
    return struct.pack(">HH", kind, len(data)) + data


def _handshake(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + len(body).to_bytes(3, "big") + body


def client_hello(rng: random.Random, sni: str, alpn: tuple[str, ...]) -> tuple[bytes, bytes]:
    """The client sidecar's ClientHello record and its legacy session id (the server echoes it)."""
    name = sni.encode()
    protos = b"".join(bytes([len(p)]) + p.encode() for p in alpn)
    exts = b"".join((
        _ext(0, struct.pack(">HBH", len(name) + 3, 0, len(name)) + name),  # server_name: host_name
        _ext(23, b""),  # extended_master_secret
        _ext(65281, b"\x00"),  # renegotiation_info
        _ext(10, struct.pack(">H", 2 * len(GROUPS)) + b"".join(struct.pack(">H", g) for g in GROUPS)),
        _ext(11, b"\x01\x00"),  # ec_point_formats: uncompressed
        _ext(16, struct.pack(">H", len(protos)) + protos),  # application_layer_protocol_negotiation
        _ext(13, struct.pack(">H", 2 * len(SIG_ALGS)) + b"".join(struct.pack(">H", s) for s in SIG_ALGS)),
        _ext(51, struct.pack(">HHH", 36, X25519, 32) + rng.randbytes(32)),  # key_share
        _ext(45, b"\x01\x01"),  # psk_key_exchange_modes: psk_dhe_ke
        _ext(43, b"\x04" + struct.pack(">HH", TLS13, TLS12)),  # supported_versions
    ))
    session = rng.randbytes(32)
    body = (struct.pack(">H", TLS12) + rng.randbytes(32) + bytes([len(session)]) + session
            + struct.pack(">H", 2 * len(CIPHER_SUITES)) + b"".join(struct.pack(">H", c) for c in CIPHER_SUITES)
            + b"\x01\x00" + struct.pack(">H", len(exts)) + exts)
    return record(HANDSHAKE, _handshake(1, body), 0x0301), session


def server_hello(rng: random.Random, session: bytes) -> bytes:
    """The server sidecar's ServerHello record choosing TLS 1.3, TLS_AES_128_GCM_SHA256 and X25519."""
    exts = _ext(43, struct.pack(">H", TLS13)) + _ext(51, struct.pack(">HH", X25519, 32) + rng.randbytes(32))
    body = (struct.pack(">H", TLS12) + rng.randbytes(32) + bytes([len(session)]) + session
            + struct.pack(">HB", 0x1301, 0) + struct.pack(">H", len(exts)) + exts)
    return record(HANDSHAKE, _handshake(2, body))


def sealed(cipher, n: int) -> bytes:
    """Application-data records carrying ``n`` plaintext bytes, cut at MAX_PLAINTEXT; ``cipher(k)`` gives k
    bytes of ciphertext (random-looking)."""
    out = []
    while True:
        k = min(n, MAX_PLAINTEXT)
        out.append(record(APPLICATION_DATA, cipher(k + SEAL_OVERHEAD)))
        n -= k
        if n <= 0:
            return b"".join(out)
