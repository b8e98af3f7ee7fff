"""Access-log lines of a request's hops as the sidecars of a mesh write them: Istio's TEXT format
(envoy/istio_formats.py), each hop's four-tuple as the two sidecars see it (the caller's %UPSTREAM_LOCAL_ADDRESS%
is the server's %DOWNSTREAM_REMOTE_ADDRESS%; the caller's %UPSTREAM_HOST% the server's
%DOWNSTREAM_LOCAL_ADDRESS%, its pod IP:port after the REDIRECT)."""

from __future__ import annotations

from dataclasses import dataclass

from kubectl_meshdoctor.envoy.istio_formats import TEXT_FORMATS

from ..envoy.render import render_text

T0 = 1764770498.768
DETAILS = {"UF": "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:"
                 "_Connection_refused}",
           "UT": "response_timeout", "DC": "downstream_remote_disconnect",
           "UPE": "upstream_reset_before_response_started{protocol_error}", "-": "via_upstream"}


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str
    port: int
    service: str

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"


def _line(code: int, flag: str, rid: str | None, dt: float, duration_ms: int, **addresses) -> str:
    return render_text(TEXT_FORMATS[0].format, {
        "ts": T0 + dt, "method": "GET", "path": "/orders", "protocol": "HTTP/1.1", "code": code,
        "flags": () if flag == "-" else (flag,), "details": DETAILS[flag], "bytes_sent": 98,
        "duration_ms": duration_ms, "request_id": rid, **addresses})


def outbound(src: Pod, dst: Pod, code: int, flag: str, rid: str | None, dt: float, source_port: int,
             duration_ms: int = 3, with_local: bool = True, with_host: bool = True) -> str:
    """``src``'s sidecar's line of its call to ``dst`` (its outbound cluster), the connection from
    ``src.ip:source_port``."""
    return _line(code, flag, rid, dt, duration_ms, upstream_host=dst.address if with_host else None,
                 upstream_cluster=f"outbound|{dst.port}||{dst.service}.shop.svc.cluster.local",
                 upstream_local=f"{src.ip}:{source_port}" if with_local else None, downstream_local="10.96.14.2:80",
                 downstream_remote=f"{src.ip}:40100")


def inbound(src: Pod, dst: Pod, code: int, flag: str, rid: str | None, dt: float, source_port: int,
            duration_ms: int = 2, with_remote: bool = True, with_local: bool = True) -> str:
    """``dst``'s sidecar's line of ``src``'s call (its inbound cluster), the connection from
    ``src.ip:source_port``."""
    return _line(code, flag, rid, dt, duration_ms, upstream_host=dst.address, upstream_cluster=f"inbound|{dst.port}||",
                 upstream_local="127.0.0.6:53111", downstream_local=dst.address if with_local else None,
                 downstream_remote=f"{src.ip}:{source_port}" if with_remote else None)
