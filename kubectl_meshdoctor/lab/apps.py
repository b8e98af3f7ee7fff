"""The lab pod's applications: an HTTP/1.1 server (port 5000) and a TCP echo server (port 5002).

Written on raw asyncio streams on purpose: later knobs make the HTTP app emit framing no library would
(duplicate Transfer-Encoding, TE with Content-Length), close idle keep-alives, or listen on 127.0.0.1 only.

Run in a pod namespace:
    python -m kubectl_meshdoctor.lab.apps http [--port 5000] [--bind 0.0.0.0]
    python -m kubectl_meshdoctor.lab.apps tcp-echo [--port 5002] [--bind 0.0.0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass

HTTP_PORT = 5000
ECHO_PORT = 5002
_MAX_HEAD = 65536  # bytes of request line + headers we accept
_CHUNK = 65536


class BadRequest(Exception):
    """The request head could not be parsed."""


@dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]  # wire order, original case

    def header(self, name: str) -> str | None:
        """First value of a header (names compare case-insensitively), or None."""
        lname = name.lower()
        return next((v for k, v in self.headers if k.lower() == lname), None)

    @property
    def keep_alive(self) -> bool:
        conn = (self.header("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


def parse_head(head: bytes) -> HttpRequest:
    """Parse a request head (up to and including the blank line); raises BadRequest."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest(f"header line without colon: {line!r}")
            headers.append((name, value.strip()))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return HttpRequest(method, target, version, tuple(headers))


@dataclass(frozen=True)
class HttpAppConfig:
    """Knobs of the HTTP app. `body` is what every request gets (bytes)."""

    bind: str = "0.0.0.0"
    port: int = HTTP_PORT
    body: bytes = b"ok from meshdoctor lab\n"


class HttpApp:
    """A keep-alive HTTP/1.1 server answering every request `200` with a Content-Length body."""

    def __init__(self, config: HttpAppConfig) -> None:
        self._config = config

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await asyncio.start_server(
            self._handle, self._config.bind, self._config.port, reuse_address=True, limit=_MAX_HEAD
        )
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # downstream closed between requests
                try:
                    request = parse_head(head)
                    await _discard_body(reader, request)
                except BadRequest:
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    await writer.drain()
                    break
                writer.write(self._response(request))
                await writer.drain()
                if not request.keep_alive:
                    break
        except (ConnectionError, OSError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _response(self, request: HttpRequest) -> bytes:
        body = b"" if request.method == "HEAD" else self._config.body
        connection = "keep-alive" if request.keep_alive else "close"
        head = (
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/plain\r\n"
            f"Content-Length: {len(self._config.body)}\r\n"
            f"Connection: {connection}\r\n"
            "\r\n"
        )
        return head.encode("latin-1") + body


async def _discard_body(reader: asyncio.StreamReader, request: HttpRequest) -> None:
    """Read and drop a Content-Length request body (clients here send no chunked bodies)."""
    length = request.header("content-length")
    if length is None:
        return
    try:
        remaining = int(length)
    except ValueError:
        raise BadRequest(f"bad Content-Length {length!r}") from None
    if remaining < 0:
        raise BadRequest(f"bad Content-Length {length!r}")
    await reader.readexactly(remaining)


@dataclass(frozen=True)
class EchoAppConfig:
    bind: str = "0.0.0.0"
    port: int = ECHO_PORT


class EchoApp:
    """A TCP echo server: every byte read is written back; EOF from the peer is answered with EOF."""

    def __init__(self, config: EchoAppConfig) -> None:
        self._config = config

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await asyncio.start_server(self._handle, self._config.bind, self._config.port, reuse_address=True)
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubectl_meshdoctor.lab.apps", description=__doc__)
    parser.add_argument("app", choices=("http", "tcp-echo"))
    parser.add_argument("--bind", default="0.0.0.0", help="listen address (127.0.0.1 = unreachable via eth0)")
    parser.add_argument("--port", type=int, help="listen port (default 5000 for http, 5002 for tcp-echo)")
    args = parser.parse_args(argv)
    if args.app == "http":
        app: HttpApp | EchoApp = HttpApp(HttpAppConfig(bind=args.bind, port=args.port or HTTP_PORT))
    else:
        app = EchoApp(EchoAppConfig(bind=args.bind, port=args.port or ECHO_PORT))
    try:
        asyncio.run(app.serve_forever())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"{args.app}: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
