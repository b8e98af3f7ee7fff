"""An HTTP/2 app for the lab, cleartext with prior knowledge (h2c, as Envoy talks to an `appProtocol: http2`
port), built on the `h2` protocol library: it answers every stream 200 unless told to refuse.

- ``refuse_every`` N: every Nth stream is reset with REFUSED_STREAM (RFC 9113 section 8.7: not processed,
  safe to retry), as a server at its concurrency limit does.
- ``goaway_after`` N: after N streams on a connection it sends GOAWAY naming the last stream it processed and
  closes (RFC 9113 section 6.8), as a server that shuts down or rotates connections does; streams the peer
  opened after it are refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

BODY = b"ok from meshdoctor lab over h2\n"


@dataclass(frozen=True)
class H2AppConfig:
    bind: str = "0.0.0.0"
    port: int = 5000
    refuse_every: int = 0  # 0: never
    goaway_after: int = 0  # 0: never


class H2App:
    """One asyncio server; each connection keeps its own h2 state machine."""

    def __init__(self, config: H2AppConfig) -> None:
        self._config = config
        self._streams = 0  # across connections: every Nth stream of the app is refused

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await asyncio.start_server(self._handle, self._config.bind, self._config.port, reuse_address=True)
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        served = 0
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        self._streams += 1
                        if self._config.refuse_every and self._streams % self._config.refuse_every == 0:
                            conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                            continue
                        conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", "text/plain"),
                                                            ("content-length", str(len(BODY)))])
                        conn.send_data(event.stream_id, BODY, end_stream=True)
                        served += 1
                        if self._config.goaway_after and served >= self._config.goaway_after:
                            conn.close_connection(last_stream_id=event.stream_id)
                            writer.write(conn.data_to_send())
                            await writer.drain()
                            return
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()
