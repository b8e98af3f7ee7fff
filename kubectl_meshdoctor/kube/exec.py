"""Exec in a pod's container through the API server: a stream to read frame by frame (its websocket opened with
aiohttp, whose compiled frame reader is what a busy capture needs: bench/RESULTS.md, issue 34), or a command's
output (the official client's stream()), and what the exec status on the error channel says (the remotecommand protocol, v4/v5: a JSON ``Status``,
``Success`` or a ``Failure`` whose ``details.causes`` hold the ``ExitCode``; v1-v3: plain text)."""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode, urlparse

import aiohttp
import certifi
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream as k8s_stream
from kubernetes.stream import ws_client

from .client import Kube, KubeError, api_error_message

# The remotecommand subprotocols the official client offers, newest first (kubernetes/stream/ws_client.py):
# v5 adds the half-close of stdin (a frame on channel 255) that stops tcpdump with its last packets flushed.
EXEC_PROTOCOLS = (ws_client.V5_CHANNEL_PROTOCOL, ws_client.V4_CHANNEL_PROTOCOL)
CLOSE_CHANNEL = 255  # v5: a frame [255, channel] closes that channel (k8s.io/apimachinery wsstream, remotecommand)
REFUSAL_BODY_MAX = 65536  # bytes of a refused upgrade's body (the API's Status) kept for its message


@dataclass(frozen=True, slots=True)
class ExecTarget:
    """Where an exec websocket goes, from the loaded kubeconfig: ``url`` (ws:// or wss://, the command and the
    stream switches in its query) and ``authorization`` (the header the client's auth settings gave: a bearer
    token, an exec plugin's token; None with client certificates). The
    header is left out of repr: it must never reach a log or an error."""

    url: str
    authorization: str | None = field(default=None, repr=False)


def exec_target(kube: Kube, namespace: str, pod: str, container: str, command: list[str]) -> ExecTarget:
    """The exec websocket's URL and auth header for ``command`` in ``container`` (stdin, stdout and stderr open,
    no TTY). The URL is the API's pod exec subresource, ``GET {host}/api/v1/namespaces/NS/pods/POD/exec`` with
    a ``command`` parameter a word (Kubernetes API reference, "connect GET exec of Pod"; the kubeconfig's server
    may carry a path prefix, kept). The header is the client Configuration's bearer token
    (``auth_settings()``: its refresh hook runs there, so exec plugins and expiring tokens work as in every
    other call); None with client certificates alone. The connection is open_exec_ws's."""
    configuration = kube.api.configuration
    query = [("command", word) for word in command]
    query += [("container", container), ("stdin", "true"), ("stdout", "true"), ("stderr", "true"), ("tty", "false")]
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
    host = configuration.host.rstrip("/")
    scheme, sep, rest = host.partition("://")
    ws_scheme = {"https": "wss", "http": "ws"}.get(scheme.lower(), scheme) if sep else "wss"
    url = f"{ws_scheme}://{rest if sep else host}{path}?{urlencode(query)}"
    bearer = configuration.auth_settings().get("BearerToken") or {}
    return ExecTarget(url, bearer.get("value") or None)


def ssl_context_of(configuration) -> ssl.SSLContext:
    """The TLS settings the official client's websocket uses (ws_client.create_websocket), as an SSLContext:
    the kubeconfig's CA (else certifi's bundle, as there) and the hostname checked unless assert_hostname says
    otherwise, when verify_ssl; CERT_NONE when not; its client certificate and key in both cases. Raises
    OSError (ssl.SSLError) for a CA, certificate or key that cannot be loaded."""
    if configuration.verify_ssl:
        ctx = ssl.create_default_context(cafile=configuration.ssl_ca_cert or certifi.where())
        if configuration.assert_hostname is not None:
            ctx.check_hostname = bool(configuration.assert_hostname)
    else:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        ctx.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return ctx


def _refusal_keeper(bodies: list[bytes]) -> type[aiohttp.ClientResponse]:
    """A response class that reads a refused upgrade's body (the API server's Status: ``pods "x" is forbidden``)
    into ``bodies`` before aiohttp raises WSServerHandshakeError, which carries only the status: the Status's
    message is what kubectl prints, and what the official client's websocket reported."""

    class KeepsRefusal(aiohttp.ClientResponse):
        async def start(self, connection) -> aiohttp.ClientResponse:
            resp = await super().start(connection)
            if self.status != 101:
                try:
                    bodies.append(await self.content.read(REFUSAL_BODY_MAX))
                except (aiohttp.ClientError, OSError):
                    pass
            return resp

    return KeepsRefusal


def _proxy_for(configuration, url: str) -> str | None:
    """The kubeconfig's proxy-url for ``url``, unless its host is in no_proxy (a name or a domain suffix)."""
    proxy = configuration.proxy or None
    host = urlparse(url).hostname or ""
    for entry in (configuration.no_proxy or "").split(","):
        entry = entry.strip().lstrip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return None
    return proxy


async def open_exec_ws(kube: Kube, target: ExecTarget, connector: aiohttp.BaseConnector | None = None
                       ) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    """(a session, the exec websocket in it) for ``target``, subprotocols v5 then v4 offered, binary frames
    ``[channel] + bytes``; the caller closes both. Raises ApiException when the server refuses the upgrade (its
    status and the Status body it sent, which api_error_message reads) or the connection fails (status 0 and the
    reason; never the auth header). Connecting is bounded by the client's request timeout, reading is not.
    ``connector``: how to reach the server (tests: a Unix socket), else TCP as the URL says."""
    configuration = kube.api.configuration
    headers = {"authorization": target.authorization} if target.authorization else {}
    bodies: list[bytes] = []
    session = aiohttp.ClientSession(connector=connector, response_class=_refusal_keeper(bodies),
                                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=kube.request_timeout_s))
    try:
        ws = await session.ws_connect(
            target.url, protocols=EXEC_PROTOCOLS, headers=headers, max_msg_size=0, autoping=True,
            ssl=ssl_context_of(configuration) if target.url.startswith("wss://") else False,  # plain ws:// (http)
            server_hostname=configuration.tls_server_name or None, proxy=_proxy_for(configuration, target.url),
            proxy_headers=configuration.proxy_headers or None)
    except aiohttp.WSServerHandshakeError as e:
        await session.close()
        raise (_refused(e.status, bodies[-1]) if bodies else ApiException(status=e.status, reason=e.message)) from None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:  # ssl.SSLError is an OSError
        await session.close()
        raise ApiException(status=0, reason=str(e) or type(e).__name__) from None
    except BaseException:
        await session.close()
        raise
    return session, ws


def _refused(status: int, body: bytes) -> ApiException:
    e = ApiException(status=status, reason="the API server refused the exec")
    e.body = body.decode("utf-8", "replace")
    return e


def exec_output(kube: Kube, namespace: str, pod: str, container: str, command: list[str], what: str) -> str:
    """What ``command`` in ``container`` printed (stdout and stderr), within the client's request timeout.
    Raises KubeError ("``what``: why") when the exec is refused."""
    try:
        return k8s_stream(kube.streaming_core().connect_get_namespaced_pod_exec, pod, namespace,
                          container=container, command=command, stdin=False, stdout=True, stderr=True, tty=False,
                          _request_timeout=kube.request_timeout_s)
    except Exception as e:
        raise KubeError(f"{what}: {api_error_message(e)}") from None


def exit_code_of(status: bytes) -> int | None:
    """The exit code in an exec status (v4/v5 error channel): 0 for Success, the ExitCode cause otherwise."""
    try:
        st = json.loads(status)
    except ValueError:
        return None
    if st.get("status") == "Success":
        return 0
    for cause in (st.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message"))
            except (TypeError, ValueError):
                return None
    return None


def status_message(status: bytes) -> str:
    """The first line of an exec status's message: a v4/v5 JSON Status, or v1-v3 plain text."""
    try:
        st = json.loads(status)
        text = st.get("message") if isinstance(st, dict) else None
    except ValueError:
        text = None
    lines = (text or status.decode("utf-8", "replace")).strip().splitlines()
    return lines[0] if lines else "the exec failed without a message"
