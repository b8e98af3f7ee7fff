"""Exec in a pod's container through the API server: a stream to read frame by frame, or a command's output,
and what the exec status on the error channel says (the remotecommand protocol, v4/v5: a JSON ``Status``,
``Success`` or a ``Failure`` whose ``details.causes`` hold the ``ExitCode``; v1-v3: plain text)."""

from __future__ import annotations

import json

from kubernetes.stream import stream as k8s_stream

from .client import Kube, KubeError, api_error_message


def open_exec(kube: Kube, namespace: str, pod: str, container: str, command: list[str]):
    """The exec websocket (the official client's WSClient, binary, stdin open) of ``command`` in ``container``.
    Raises what the client raises when the API refuses it (api_error_message says it in one line)."""
    return k8s_stream(kube.streaming_core().connect_get_namespaced_pod_exec, pod, namespace,
                      container=container, command=command,
                      stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True)


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
