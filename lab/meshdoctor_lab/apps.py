"""The lab pod's applications: an HTTP/1.1 server (port 5000) and a TCP echo server (port 5002).

Written on raw asyncio streams on purpose: knobs make the HTTP app emit framing no library would, close idle
keep-alives, or listen on 127.0.0.1 only.

HTTP paths (every app): `/chunked` answers with a valid chunked body, `/close` answers with Content-Length and
`Connection: close` and then closes (FIN), `/status/CODE` answers that status, `/slow/SECONDS` answers after that
long, anything else answers 200 with Content-Length only. A request whose first byte cannot start a method (a TLS
ClientHello) is answered 400 and closed at once. With
`--broken-framing` the paths in FRAMING_VARIANTS answer with that broken framing, and every other path rotates
through them. Each response (status line, fields and body) is written with one send(), so the whole header
block is in the first TCP segment. Events (idle closes, broken responses) are logged to stdout.

`--fast` swaps in FastHttpApp, a canned keep-alive responder for load (the `load` scenario): every request
head gets the same 200 with a Content-Length body, on `--port` and on every `--also-port`, at a small fraction
of the HTTP app's CPU per request. It reads no request bodies (the load clients send GETs only).

Run in a pod namespace:
    python -m meshdoctor_lab.apps http [--port 5000] [--bind 0.0.0.0] [--idle-timeout S] [--broken-framing]
    python -m meshdoctor_lab.apps http --fast [--port 5000] [--also-port 15020]
    python -m meshdoctor_lab.apps tcp-echo [--port 5002] [--bind 0.0.0.0]
    python -m meshdoctor_lab.apps server-first [--port 5002]   # writes GREETING on accept, then echoes
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import sys
import time
from dataclasses import dataclass

HTTP_PORT = 5000
ECHO_PORT = 5002
_MAX_HEAD = 65536  # bytes of request line + headers we accept
_CHUNK = 65536

_BROKEN_BODY = b"hello"
# Path -> response head fields whose framing Envoy's HTTP/1 codec rejects (RFC 9112 section 6.3 / 5.1).
FRAMING_VARIANTS: dict[str, tuple[str, ...]] = {
    "/dup-te": ("Transfer-Encoding: chunked", "Transfer-Encoding: Chunked"),
    "/te-cl": ("Transfer-Encoding: chunked", f"Content-Length: {len(_BROKEN_BODY)}"),
    "/cl-conflict": (f"Content-Length: {len(_BROKEN_BODY)}", f"Content-Length: {len(_BROKEN_BODY) + 1}"),
    "/te-not-last": ("Transfer-Encoding: chunked, gzip",),
    "/bad-header-name": ("X-Bad : 1", f"Content-Length: {len(_BROKEN_BODY)}"),
}
CHUNKED_BODY = b"hello from a chunked body\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
# RFC 9110 section 5.6.2: the characters of a token, a method's among them
_TCHAR = frozenset(bytes([c]) for c in b"!#$%&'*+-.^_`|~0123456789"
                   b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


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
    idle_timeout: float | None = None  # seconds a keep-alive connection may sit idle before we close it
    broken_framing: bool = False  # serve FRAMING_VARIANTS
    close_delay: float = 0.0  # seconds between the idle timer firing and close(), reading paused meanwhile


MAX_SLOW_S = 30.0
_REASONS = {200: "OK", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}


def _status_of(path: str) -> int | None:
    """The status ``/status/CODE`` asks for (200 to 599), else None."""
    if not path.startswith("/status/"):
        return None
    code = path[len("/status/"):]
    return int(code) if code.isdigit() and 200 <= int(code) <= 599 else None


def slow_delay(target: str) -> float:
    """Seconds ``/slow/<seconds>`` asks the app to take before it answers (at most MAX_SLOW_S); 0 otherwise."""
    path = target.split("?", 1)[0]
    if not path.startswith("/slow/"):
        return 0.0
    try:
        return min(max(float(path[len("/slow/"):]), 0.0), MAX_SLOW_S)
    except ValueError:
        return 0.0


class HttpApp:
    """A keep-alive HTTP/1.1 server (200 with a Content-Length body unless a path or knob says otherwise)."""

    def __init__(self, config: HttpAppConfig) -> None:
        self._config = config
        self._rotation = itertools.cycle(FRAMING_VARIANTS)

    async def serve_forever(self) -> None:
        """Listen until cancelled; raises OSError when the port cannot be bound."""
        server = await asyncio.start_server(
            self._handle, self._config.bind, self._config.port, reuse_address=True, limit=_MAX_HEAD
        )
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            while True:
                try:
                    first = await asyncio.wait_for(reader.readexactly(1), self._config.idle_timeout)
                except asyncio.IncompleteReadError:
                    break  # downstream closed between requests
                except asyncio.TimeoutError:
                    _log(f"idle close {peer[0]}:{peer[1]} after {self._config.idle_timeout:g} s")
                    if self._config.close_delay:
                        # The idle timer has fired but close() comes later (a busy event loop, a slow close
                        # path): bytes that arrive now stay unread in the kernel, so close() answers them RST.
                        writer.transport.pause_reading()
                        await asyncio.sleep(self._config.close_delay)
                    break
                if first not in _TCHAR:
                    # Not a method's first byte (a TLS ClientHello starts 0x16): answered at once, as llhttp (Node)
                    # and nginx answer it, instead of waiting for a header block that never comes.
                    _log(f"not HTTP from {peer[0]}:{peer[1]}: first byte {first!r}")
                    writer.write(_BAD_REQUEST)
                    await writer.drain()
                    break
                try:
                    head = first + await reader.readuntil(b"\r\n\r\n")
                    request = parse_head(head)
                    await _discard_body(reader, request)
                except BadRequest:
                    writer.write(_BAD_REQUEST)
                    await writer.drain()
                    break
                delay = slow_delay(request.target)
                if delay:
                    await asyncio.sleep(delay)  # the app's own slowness: what a route timeout measures
                response, keep_open = self._response(request)
                writer.write(response)  # one send(): the transport writes at once when its buffer is empty
                await writer.drain()
                if not (request.keep_alive and keep_open):
                    break
        except (ConnectionError, OSError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _response(self, request: HttpRequest) -> tuple[bytes, bool]:
        """(response bytes, keep the connection open afterwards)."""
        path = request.target.split("?", 1)[0]
        if self._config.broken_framing:
            variant = path if path in FRAMING_VARIANTS else next(self._rotation)
            _log(f"broken framing {variant} for {request.method} {request.target}")
            return self._broken(variant), variant != "/te-not-last"
        if path == "/chunked":
            size = f"{len(CHUNKED_BODY):x}".encode()
            body = size + b"\r\n" + CHUNKED_BODY + b"\r\n0\r\n\r\n"
            return self._head(request, ("Transfer-Encoding: chunked",)) + body, True
        status = _status_of(path)
        if status is not None:  # /status/CODE: what a failing app answers (the outlier scenario's burst)
            body = f"status {status}\n".encode()
            return self._head(request, (f"Content-Length: {len(body)}",), status) + body, True
        close = path == "/close"
        body = b"" if request.method == "HEAD" else self._config.body
        fields = (f"Content-Length: {len(self._config.body)}",) + (("Connection: close",) if close else ())
        if self._config.idle_timeout is not None and not close:
            # What Node.js, Apache and others announce: the keep-alive timeout a client's pool must stay under.
            fields += (f"Keep-Alive: timeout={self._config.idle_timeout:g}",)
        return self._head(request, fields) + body, not close

    @staticmethod
    def _head(request: HttpRequest, fields: tuple[str, ...], status: int = 200) -> bytes:
        if not request.keep_alive and "Connection: close" not in fields:
            fields += ("Connection: close",)
        lines = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", "Content-Type: text/plain", *fields)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    @staticmethod
    def _broken(variant: str) -> bytes:
        fields = FRAMING_VARIANTS[variant]
        if any("chunked" in f for f in fields):
            body = f"{len(_BROKEN_BODY):x}\r\n".encode() + _BROKEN_BODY + b"\r\n0\r\n\r\n"
        else:
            body = _BROKEN_BODY + b"!"  # one byte more than the smaller Content-Length
        if variant == "/bad-header-name":
            body = _BROKEN_BODY
        lines = ("HTTP/1.1 200 OK", "Content-Type: text/plain", *fields)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


FAST_BODY = b"ok\n"
FAST_RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(FAST_BODY)
                 + FAST_BODY)
_FAST_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _FastHttpProtocol(asyncio.Protocol):
    """One connection of FastHttpApp: each complete request head is answered with FAST_RESPONSE, pipelined
    heads with as many responses in one write; `Connection: close` gets a close response and a FIN."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\r\n\r\n")
        if end == -1:
            if len(buf) > _MAX_HEAD:
                self._transport.close()
            self._buf = buf
            return
        heads = buf[:end + 4]
        self._buf = buf[end + 4:]
        if b"onnection" in heads and re.search(rb"(?i)\r\nconnection:[ \t]*close", heads):
            self._transport.write(FAST_RESPONSE * (heads.count(b"\r\n\r\n") - 1) + _FAST_CLOSE)
            self._transport.close()
            return
        self._transport.write(FAST_RESPONSE * heads.count(b"\r\n\r\n"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


class FastHttpApp:
    """A keep-alive HTTP/1.1 responder for load: the same 200 for every request head, on several ports."""

    def __init__(self, bind: str = "0.0.0.0", ports: tuple[int, ...] = (HTTP_PORT,)) -> None:
        self._bind = bind
        self._ports = ports

    async def serve_forever(self) -> None:
        """Listen on every port until cancelled; raises OSError when a port cannot be bound. The first port is
        bound last, so a client that sees it listening finds the others listening too."""
        loop = asyncio.get_running_loop()
        servers = [await loop.create_server(_FastHttpProtocol, self._bind, port, reuse_address=True)
                   for port in reversed(self._ports)]
        try:
            await asyncio.gather(*(server.serve_forever() for server in servers))
        finally:
            for server in servers:
                server.close()


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


# What the server-first app writes on accept, before it reads anything (a MySQL server's handshake, an SMTP 220).
GREETING = b"220 meshdoctor-lab server-first ready\r\n"


class ServerFirstApp(EchoApp):
    """A server-first TCP server (MySQL, SMTP, FTP shape): on accept it writes GREETING and only then reads;
    afterwards it echoes like EchoApp. Its client waits for the greeting before it writes."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(GREETING)
            await writer.drain()
        except (ConnectionError, OSError):
            writer.close()
            return
        await super()._handle(reader, writer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshdoctor_lab.apps", description=__doc__)
    parser.add_argument("app", choices=("http", "h2c", "tcp-echo", "server-first"))
    parser.add_argument("--bind", default="0.0.0.0", help="listen address (127.0.0.1 = unreachable via eth0)")
    parser.add_argument("--port", type=int,
                        help="listen port (default 5000 for http, 5002 for tcp-echo and server-first)")
    parser.add_argument("--idle-timeout", type=float, help="http: close keep-alive connections idle this long (s)")
    parser.add_argument("--close-delay", type=float, default=0.0,
                        help="http: seconds from the idle timer to close(), not reading meanwhile")
    parser.add_argument("--broken-framing", action="store_true", help="http: answer with broken framing")
    parser.add_argument("--fast", action="store_true", help="http: canned keep-alive responder for load")
    parser.add_argument("--also-port", type=int, action="append", default=[],
                        help="http --fast: listen on this port too (repeatable)")
    parser.add_argument("--refuse-every", type=int, default=0,
                        help="h2c: reset every Nth stream with REFUSED_STREAM (0: never)")
    parser.add_argument("--goaway-after", type=int, default=0,
                        help="h2c: send GOAWAY and close after N streams on a connection (0: never)")
    args = parser.parse_args(argv)
    if args.app == "h2c":
        from meshdoctor_lab.h2app import H2App, H2AppConfig  # the h2 library: a dependency of the lab

        app = H2App(H2AppConfig(bind=args.bind, port=args.port or HTTP_PORT, refuse_every=args.refuse_every,
                                goaway_after=args.goaway_after))
    elif args.app == "http" and args.fast:
        app = FastHttpApp(args.bind, (args.port or HTTP_PORT, *args.also_port))
    elif args.app == "http":
        app = HttpApp(HttpAppConfig(
            bind=args.bind, port=args.port or HTTP_PORT, idle_timeout=args.idle_timeout,
            close_delay=args.close_delay, broken_framing=args.broken_framing))
    elif args.app == "server-first":
        app = ServerFirstApp(EchoAppConfig(bind=args.bind, port=args.port or ECHO_PORT))
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
