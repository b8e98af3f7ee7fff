"""metav1.Status bodies for API errors, worded as the real API server words them (k8s.io/apimachinery/pkg/api/errors).
"""

from __future__ import annotations

from typing import Any, Mapping

from aiohttp import web


STATUS_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_failure(
    code: int, message: str, reason: str | None = None, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A metav1.Status body for an HTTP error, as the API server writes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or STATUS_REASONS.get(code, "Unknown"),
    }
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


def not_found(resource: str, name: str, group: str = "") -> dict[str, Any]:
    """404 for a missing object: `pods "x" not found` with details name/kind (group only for non-core)."""
    qualified = f"{resource}.{group}" if group else resource
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = resource
    return status_failure(404, f'{qualified} "{name}" not found', details=details)


def forbidden(user: str, verb: str, resource: str, subresource: str, group: str, namespace: str, name: str) -> dict:
    """403 as RBAC denies it: `pods "x" is forbidden: User "u" cannot patch resource "pods/ephemeralcontainers" ...`."""
    full = f"{resource}/{subresource}" if subresource else resource
    qualified = f"{resource}.{group}" if group else resource
    subject = f'{qualified} "{name}"' if name else qualified
    message = (
        f'{subject} is forbidden: User "{user}" cannot {verb} resource "{full}" in API group "{group}" '
        f'in the namespace "{namespace}"'
    )
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = resource
    return status_failure(403, message, details=details)


def status_response(body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    """A Status body as the HTTP response, with its code as the HTTP status."""
    return web.json_response(body, status=int(body.get("code", 500)), headers=headers)


def query_flag(request: web.Request, key: str) -> bool:
    """A boolean query parameter (`watch=true`, `stdin=1`), as the API server reads one."""
    return request.query.get(key, "").lower() in ("true", "1", "yes")
