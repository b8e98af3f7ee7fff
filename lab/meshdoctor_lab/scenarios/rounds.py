"""What a round records (RoundResult, filled through a Tally), and the socket exchanges every family of drivers
uses."""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

IO_TIMEOUT = 5.0  # seconds per socket operation


@dataclass(frozen=True)
class RoundResult:
    """What one round did, from the client's side plus the pod kernel's challenge-ACK counter.

    `challenge_acks` is the increase of TcpExtTCPChallengeACK in the pod namespace during the round (None when
    nstat could not be read). `second_connect_s` is how long the colliding connect took (seconds).
    """

    scenario: str
    pod: str
    started: float  # seconds since epoch
    duration_s: float
    client_port: int | None = None
    http_ok: int = 0
    echo_ok: int = 0
    second_connect_s: float | None = None
    live_reset: bool = False
    challenge_acks: int | None = None
    errors: tuple[str, ...] = ()
    # HTTP scenarios: (path, status, body) of every request in order; the body only when it is not 200.
    http: tuple[tuple[str, int, str], ...] = ()
    connect_s: float | None = None  # syn-drop: how long the connect to :5002 took (seconds)
    reused_after_s: float | None = None  # stale-keepalive: response 1 -> request 2 (seconds)
    load: dict[str, Any] | None = None  # load: LoadResult.to_json()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["errors"] = list(self.errors)
        data["http"] = [list(h) for h in self.http]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RoundResult":
        return cls(**{**data, "errors": tuple(data.get("errors", ())),
                      "http": tuple((p, int(c), b) for p, c, b in data.get("http", ()))})

    @property
    def statuses(self) -> tuple[int, ...]:
        return tuple(status for _, status, _ in self.http)


@dataclass
class Tally:
    """Mutable counters filled while a round runs, frozen into a RoundResult at the end."""

    client_port: int | None = None
    http_ok: int = 0
    echo_ok: int = 0
    second_connect_s: float | None = None
    live_reset: bool = False
    errors: list[str] = field(default_factory=list)
    http: list[tuple[str, int, str]] = field(default_factory=list)
    connect_s: float | None = None
    reused_after_s: float | None = None
    load: dict[str, Any] | None = None


def echo_exchange(sock: socket.socket, message: bytes) -> bool:
    sock.sendall(message)
    got = b""
    while len(got) < len(message):
        chunk = sock.recv(len(message) - len(got))
        if not chunk:
            break
        got += chunk
    return got == message


def one_line(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__
