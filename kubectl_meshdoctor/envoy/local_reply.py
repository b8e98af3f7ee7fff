"""Envoy's own answers (local replies) told from the responses it proxies, by their headers alone.

Envoy adds ``x-envoy-upstream-service-time`` to every response it proxies from an upstream, and never to a
reply it makes itself (router filter docs, "x-envoy-upstream-service-time"); its connection manager names
itself in ``server`` (Istio: ``istio-envoy``). A local reply's body is Envoy's fixed text, so its length tells
which reply it is: ``upstream request timeout`` (24 bytes) for a route timeout, ``Upgrade Required`` (16) for
refused HTTP/1.0, none for a refused upgrade, ``Bad Request`` (11) for a codec error; an AuthorizationPolicy's
403 says ``RBAC: access denied`` (19).
"""

from __future__ import annotations

from collections.abc import Iterable

SERVICE_TIME = "x-envoy-upstream-service-time"
SERVERS = ("istio-envoy", "envoy")


def is_local_reply(headers: Iterable[tuple[str, str]], body_length: int) -> bool:
    """Whether a response with these header fields (name, value) is Envoy's own, with a body of
    ``body_length`` bytes: no service time, Envoy as its server, that Content-Length."""
    fields = {name.lower(): value.strip() for name, value in headers}
    return (SERVICE_TIME not in fields and fields.get("server", "").lower() in SERVERS
            and fields.get("content-length") == str(body_length))
