"""Connecting to the cluster the way kubectl does: KUBECONFIG, --kubeconfig, --context, -n/--namespace."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import ssl
import tempfile
from dataclasses import dataclass

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from kubectl_meshdoctor.private_dirs import private_dir_prefix, remove_stale_private_dirs


class KubeError(Exception):
    """A cluster-side problem worth one line on stderr (exit 2): no kubeconfig, pod not found, forbidden."""


@dataclass(frozen=True, slots=True)
class KubeOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout_s: float | None = 30.0  # None: no timeout (kubectl's --request-timeout 0)


@dataclass(frozen=True, slots=True)
class Kube:
    """An API client bound to one kubeconfig context and the namespace commands default to."""

    api: k8s.ApiClient
    namespace: str
    context: str
    request_timeout_s: float | None

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    def streaming_core(self) -> k8s.CoreV1Api:
        """A CoreV1Api on an ApiClient of its own, for one websocket call (exec, port-forward).

        ``kubernetes.stream.stream()`` swaps the ApiClient's ``call_api`` for its websocket version for the
        length of the call; two threads doing that on one shared client (two tcpdump streams, a port-forward
        beside an exec) leave REST calls going through the websocket path ("Handshake status 200 OK"). A
        client per stream keeps the swap private.
        """
        return k8s.CoreV1Api(k8s.ApiClient(configuration=self.api.configuration))


def kubeconfig_path(explicit: str | None) -> str:
    """The kubeconfig to load: ``--kubeconfig``, else ``$KUBECONFIG`` (a list: kubectl merges its files and skips
    missing or empty ones; the client merges a ``:``-joined path the same way), else ``~/.kube/config``.

    Raises KubeError when there is none.
    """
    if explicit:
        if not os.path.isfile(explicit):
            what = "is a directory, not a kubeconfig" if os.path.isdir(explicit) else "does not exist"
            raise KubeError(f"kubeconfig {explicit} {what} (use --kubeconfig or set KUBECONFIG)")
        return explicit
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    found = [p for p in env if os.path.isfile(p) and os.path.getsize(p) > 0]
    if found:
        return os.pathsep.join(found)
    default = os.path.expanduser("~/.kube/config")
    if not env and os.path.isfile(default):
        return default
    raise KubeError(f"no kubeconfig at {os.pathsep.join(env) or default} (use --kubeconfig or set KUBECONFIG)")


def _check_kubeconfig(path: str) -> None:
    """Raise KubeError unless ``path`` is a YAML mapping: the client's loader fails cryptically on anything else."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise KubeError(f"invalid kubeconfig {path}: not valid YAML{where}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise KubeError(f"cannot read kubeconfig {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(doc, dict):
        raise KubeError(f"invalid kubeconfig {path}: not a kubeconfig (a YAML mapping with kind: Config)")


def _key_dir() -> str:
    """A private directory (0700) for the client's copies of the kubeconfig's certificate and key (it hands
    files to the TLS stack): removed at exit, and by the next run if this one is SIGKILLed. Raises KubeError
    when there is no writable temporary directory."""
    remove_stale_private_dirs()
    try:
        path = tempfile.mkdtemp(prefix=private_dir_prefix("kube"))
    except OSError as e:  # FileNotFoundError when no candidate is usable (TMPDIR, /tmp, /var/tmp, the cwd)
        raise KubeError(no_temp_dir(e)) from None
    atexit.register(shutil.rmtree, path, True)
    return path


def no_temp_dir(e: OSError) -> str:
    """One line for a temporary directory that cannot be used."""
    return f"no writable temporary directory ({e.strerror or e}); set TMPDIR to a directory this user can write"


def connect(opts: KubeOptions) -> Kube:
    """An API client for the kubeconfig and context kubectl would use, and the namespace to default to.

    Raises KubeError with a one-line message when there is no usable kubeconfig or context.
    """
    path = kubeconfig_path(opts.kubeconfig)
    for one in path.split(os.pathsep):
        _check_kubeconfig(one)
    keys = _key_dir()
    try:
        contexts, active = k8s_config.list_kube_config_contexts(config_file=path)
        ctx = next((c for c in contexts if c["name"] == opts.context), None) if opts.context else active
        if ctx is None:
            names = ", ".join(c["name"] for c in contexts) or "none"
            raise KubeError(f'context "{opts.context}" not found in {path} (contexts: {names})')
        # new_client_from_config, with the certificate and key files in a directory of ours.
        configuration = type.__call__(k8s.Configuration)
        k8s_config.load_kube_config(config_file=path, context=ctx["name"], client_configuration=configuration,
                                    temp_file_path=keys)
        api = k8s.ApiClient(configuration=configuration)
        namespace = opts.namespace or (ctx.get("context") or {}).get("namespace") or "default"
    except KubeError:
        raise
    except ImportError as e:  # a socks5:// proxy-url: urllib3 needs PySocks for it, as kubectl needs nothing
        raise KubeError(f"the kubeconfig's proxy-url needs the Python module {e.name or 'socks'} "
                        f"(pip install pysocks in the plugin's environment)") from None
    except (ConfigException, yaml.YAMLError, OSError, TypeError, AttributeError, KeyError, ValueError) as e:
        # The client's loader assumes a well-formed file; anything else surfaces as these.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise KubeError(f"invalid kubeconfig {path}: {first}") from None
    if not isinstance(namespace, str) or not isinstance(ctx["name"], str):
        raise KubeError(f"invalid kubeconfig {path}: context {ctx['name']!s:.60}: its name and namespace must be "
                        f"strings")
    return Kube(api, namespace, ctx["name"], opts.request_timeout_s)


def api_call(kube: Kube, what: str, fn, *args, not_found: str | None = None, **kwargs):
    """``fn(*args, **kwargs)`` with the request timeout, every failure turned into one KubeError line:
    ``not_found`` for a 404 (when given), the server's Status message, or why the server was not reachable."""
    try:
        return fn(*args, _request_timeout=kube.request_timeout_s, **kwargs)
    except ApiException as e:
        if e.status == 404 and not_found:
            raise KubeError(not_found) from None
        raise KubeError(f"{what}: {api_error_message(e)}") from None
    except urllib3.exceptions.HTTPError as e:
        reason = network_reason(e, kube.request_timeout_s)
        hint = ("are the user's client-certificate and client-key in the kubeconfig a pair?" if "client cert" in reason
                else "is the server URL right, and its certificate-authority in the kubeconfig?"
                if reason.startswith("TLS:") else "is the cluster up, and --context right?")
        raise KubeError(f"cannot reach the API server at {kube.api.configuration.host}: {reason} ({hint})") from None


def network_reason(e: BaseException, timeout_s: float | None) -> str:
    """Why a request got no answer, in a few words, from the innermost cause of a urllib3 error (through
    MaxRetryError.reason, ProtocolError's arguments, NewConnectionError's __cause__): "connection refused",
    "connection reset by peer", "TLS: certificate verify failed: self-signed certificate", or "no answer within
    N s (--request-timeout)"."""
    chain = [e]
    while len(chain) < 8:
        here = chain[-1]
        inner = getattr(here, "reason", None)
        if not isinstance(inner, BaseException):
            inner = next((a for a in reversed(here.args) if isinstance(a, BaseException)), here.__cause__)
        if inner is None or inner in chain:
            break
        chain.append(inner)
    cause = chain[-1]
    # NewConnectionError is a ConnectTimeoutError to urllib3 even when the connection was refused: ask the cause.
    if isinstance(cause, TimeoutError) or isinstance(cause, urllib3.exceptions.TimeoutError) \
            and not isinstance(cause, urllib3.exceptions.NewConnectionError):
        return f"no answer within {timeout_s:g} s (--request-timeout)" if timeout_s else "no answer"
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError) and cause.reason == "PEM lib" or "[SSL] PEM lib" in str(cause):
        # load_cert_chain's word for a client certificate or key that is not PEM, or not a pair
        return "TLS: the kubeconfig's client certificate or key cannot be loaded (PEM lib)"
    if isinstance(cause, ssl.SSLError):
        # "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)" -> "wrong version number"
        return "TLS: " + re.sub(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$", "", str(cause))
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror[:1].lower() + cause.strerror[1:]
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__


# websocket-client's refusal of an upgrade, which the Kubernetes client passes on as its reason:
# "Handshake status 403 Forbidden -+-+- {response headers} -+-+- {body}".
_HANDSHAKE = re.compile(r"Handshake status (\d{3}) ?([^\n]*?) -\+-\+- .*? -\+-\+- (.*)\Z", re.S)


def api_error_message(e: Exception) -> str:
    """One line from an ApiException: the Status message when the server sent one, else the reason."""
    import json

    body = getattr(e, "body", None) or getattr(e, "resp_body", None)
    handshake = _HANDSHAKE.match(str(getattr(e, "reason", None) or e))
    if handshake:  # a refused exec/port-forward upgrade: the status and the server's Status, not its headers
        body = body or handshake.group(3)
        e = type("Refused", (), {"status": int(handshake.group(1)), "reason": handshake.group(2)})()
    if body:
        try:
            msg = json.loads(body).get("message")
            if msg:
                return str(msg)
        except (ValueError, AttributeError):
            pass
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None) or str(e)
    reason = str(reason).splitlines()[0]
    return f"{status} {reason}" if status else reason
