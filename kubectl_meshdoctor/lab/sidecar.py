"""Sidecar stand-in: Envoy's virtualInbound listener as far as the kernel can tell.

Listens on 0.0.0.0:15006 (where ISTIO_IN_REDIRECT sends inbound TCP), reads each downstream connection's
SO_ORIGINAL_DST, opens the upstream leg to that address from 127.0.0.6 (Envoy's inbound passthrough bind
address, RETURNed by ISTIO_OUTPUT, so the leg crosses `lo` un-REDIRECTed) and relays bytes both ways with
half-close. One Istio-format access-log line per connection goes to stdout.

Run in a pod namespace:  python -m kubectl_meshdoctor.lab.sidecar [--port 15006] [--source 127.0.0.6]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TextIO

from kubectl_meshdoctor.lab.netns import INBOUND_CAPTURE_PORT, INBOUND_PASSTHROUGH_SOURCE

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; at level SOL_IP, returns a struct sockaddr_in
_CHUNK = 65536  # bytes per read


def original_dst(sock: socket.socket) -> tuple[str, int]:
    """The (ip, port) the downstream dialled before REDIRECT rewrote it, from conntrack via SO_ORIGINAL_DST.

    Raises OSError when the connection was not NATed (e.g. someone dialled 15006 directly).
    """
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntoa(raw[4:8]), port


def _addr(pair: tuple[str, int] | None) -> str:
    return "-" if pair is None else f"{pair[0]}:{pair[1]}"


@dataclass(frozen=True)
class ConnectionRecord:
    """One downstream connection as the access log reports it (TCP proxy: no HTTP fields yet)."""

    start: float  # seconds since epoch
    downstream_remote: tuple[str, int]
    downstream_local: tuple[str, int] | None  # the original destination
    upstream_local: tuple[str, int] | None
    bytes_received: int  # from downstream
    bytes_sent: int  # to downstream
    duration_ms: int
    response_flags: str  # "-" or Envoy flags, e.g. "UF"
    failure_reason: str  # "-" or the upstream connect error

    def access_log_line(self) -> str:
        """Istio's default TEXT access-log format, TCP rendering ("- - -", status 0)."""
        start = datetime.fromtimestamp(self.start, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        cluster = f"inbound|{self.downstream_local[1]}||" if self.downstream_local else "-"
        return (
            f'[{start}] "- - -" 0 {self.response_flags} - - "{self.failure_reason}" '
            f"{self.bytes_received} {self.bytes_sent} {self.duration_ms} - "
            f'"-" "-" "-" "-" "{_addr(self.downstream_local)}" {cluster} '
            f"{_addr(self.upstream_local)} {_addr(self.downstream_local)} {_addr(self.downstream_remote)} - -"
        )


class UpstreamConnector:
    """Opens upstream connections to the app, bound to the inbound passthrough source address.

    Kept apart from the listener so HTTP/1 awareness and connection pooling can replace it.
    """

    def __init__(self, source_ip: str = INBOUND_PASSTHROUGH_SOURCE, connect_timeout: float = 10.0) -> None:
        self._source_ip = source_ip
        self._connect_timeout = connect_timeout  # seconds; Envoy's default cluster connect_timeout

    async def connect(self, dst: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to dst from source_ip; raises OSError (refused, timeout as TimeoutError)."""
        return await asyncio.wait_for(
            asyncio.open_connection(dst[0], dst[1], local_addr=(self._source_ip, 0)), self._connect_timeout
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bool]:
    """Copy until EOF, then half-close the other side. Returns (bytes copied, ended cleanly)."""
    total = 0
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
            total += len(data)
        if not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()
        return total, True
    except (ConnectionError, OSError):
        return total, False


class InboundSidecar:
    """The 15006 listener: accept downstream, connect upstream to the original destination, relay."""

    def __init__(
        self,
        upstream: UpstreamConnector,
        host: str = "0.0.0.0",
        port: int = INBOUND_CAPTURE_PORT,
        access_log: TextIO = sys.stdout,
    ) -> None:
        self._upstream = upstream
        self._host = host
        self._port = port
        self._access_log = access_log

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await asyncio.start_server(self._handle, self._host, self._port, reuse_address=True)
        async with server:
            await server.serve_forever()

    async def _handle(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter) -> None:
        start = time.time()
        sock = down_writer.get_extra_info("socket")
        remote = down_writer.get_extra_info("peername")[:2]
        flags, reason = "-", "-"
        orig: tuple[str, int] | None = None
        upstream_local: tuple[str, int] | None = None
        received = sent = 0
        try:
            orig = original_dst(sock)
            up_reader, up_writer = await self._upstream.connect(orig)
        except (OSError, asyncio.TimeoutError) as exc:
            # Envoy's TCP proxy closes the downstream when the upstream connect fails (UF); the HTTP-aware
            # version will answer 503 instead.
            flags, reason = "UF", _failure_reason(exc)
        else:
            upstream_local = up_writer.get_extra_info("sockname")[:2]
            # A reset on either leg aborts both; which side reset is not a TCP-proxy flag in Envoy either.
            (received, _), (sent, _) = await asyncio.gather(
                _relay_then_abort_on_error(down_reader, up_writer, down_writer),
                _relay_then_abort_on_error(up_reader, down_writer, up_writer),
            )
            up_writer.close()
        finally:
            down_writer.close()
        record = ConnectionRecord(
            start=start,
            downstream_remote=remote,
            downstream_local=orig,
            upstream_local=upstream_local,
            bytes_received=received,
            bytes_sent=sent,
            duration_ms=int((time.time() - start) * 1000),
            response_flags=flags,
            failure_reason=reason,
        )
        print(record.access_log_line(), file=self._access_log, flush=True)


async def _relay_then_abort_on_error(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reader_owner: asyncio.StreamWriter
) -> tuple[int, bool]:
    """Relay one direction; on a reset, abort both legs (as Envoy does) so the other direction ends too."""
    total, ok = await _pipe(reader, writer)
    if not ok:
        writer.transport.abort()
        reader_owner.transport.abort()
    return total, ok


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "connect_timeout"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"delayed_connect_error:_{exc.errno}"
    return type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubectl_meshdoctor.lab.sidecar", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=INBOUND_CAPTURE_PORT)
    parser.add_argument("--source", default=INBOUND_PASSTHROUGH_SOURCE, help="upstream bind address")
    parser.add_argument("--connect-timeout", type=float, default=10.0, help="seconds")
    args = parser.parse_args(argv)
    sidecar = InboundSidecar(UpstreamConnector(args.source, args.connect_timeout), args.host, args.port)
    try:
        asyncio.run(sidecar.serve_forever())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"sidecar: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
