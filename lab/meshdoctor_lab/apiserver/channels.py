"""The Kubernetes WebSocket channel framing (remotecommand subprotocols), independent of what runs behind it.

Binary protocols prefix each message with one channel byte; the base64 ones send text frames of an ASCII channel
digit followed by base64 of the payload (k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go; v5 adds the
close signal `0xff <channel>`, k8s.io/apimachinery/pkg/util/remotecommand/constants.go).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
V4_BASE64 = "v4.base64.channel.k8s.io"
V1 = "channel.k8s.io"
V1_BASE64 = "base64.channel.k8s.io"
# Order matters only when a client offers several and aiohttp picks the client's first one we know.
EXEC_PROTOCOLS = (V5, V4, V4_BASE64, V1, V1_BASE64)
PORTFORWARD_PROTOCOLS = (V4, V4_BASE64)

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


class FrameError(ValueError):
    """A client message that is not valid framing for the negotiated protocol."""


@dataclass(frozen=True)
class Framing:
    """How to frame messages for one negotiated subprotocol ("" = none, which means v1 binary)."""

    protocol: str

    @property
    def base64(self) -> bool:
        return self.protocol in (V4_BASE64, V1_BASE64)

    @property
    def status_json(self) -> bool:
        """v4 and later report the exit as a JSON Status on the error channel; v1 as plain text."""
        return self.protocol in (V5, V4, V4_BASE64)

    @property
    def close_signal(self) -> bool:
        """Only v5 has the half-close message `0xff <channel>`."""
        return self.protocol == V5

    def encode(self, channel: int, payload: bytes) -> bytes | str:
        """bytes -> a binary frame, str -> a text frame."""
        if self.base64:
            return chr(ord("0") + channel) + base64.b64encode(payload).decode("ascii")
        return bytes((channel,)) + payload

    def decode(self, data: bytes | str) -> tuple[int, bytes]:
        """A client frame -> (channel, payload). Raises FrameError on an empty or undecodable frame."""
        if not data:
            raise FrameError("empty frame")
        if isinstance(data, str):
            if self.base64:
                try:
                    return ord(data[0]) - ord("0"), base64.b64decode(data[1:])
                except (binascii.Error, ValueError) as exc:
                    raise FrameError(str(exc)) from None
            data = data.encode("utf-8")  # the Python client sends str payloads as text frames
        return data[0], bytes(data[1:])
