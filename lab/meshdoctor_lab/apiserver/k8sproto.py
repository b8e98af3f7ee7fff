"""Read the Kubernetes protobuf bodies kubectl >= 1.33 sends for authorization reviews (`auth can-i`).

kubectl asks `Content-Type: application/vnd.kubernetes.protobuf` (and accepts JSON back, which is what we answer).
Wire format (k8s.io/apimachinery/pkg/runtime/serializer/protobuf): the magic `k8s\\x00`, then a runtime.Unknown
message {typeMeta (1) {apiVersion (1), kind (2)}, raw (2), contentEncoding (3), contentType (4)} whose `raw` is the
object. Field numbers of the review objects, from k8s.io/api/authorization/v1/generated.proto:
SelfSubject{Access,Rules}Review {metadata 1, spec 2, status 3}; SelfSubjectAccessReviewSpec {resourceAttributes 1,
nonResourceAttributes 2}; ResourceAttributes {namespace 1, verb 2, group 3, version 4, resource 5, subresource 6,
name 7}; NonResourceAttributes {path 1, verb 2}; SelfSubjectRulesReviewSpec {namespace 1}.
"""

from __future__ import annotations

from typing import Any

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"


class ProtoError(ValueError):
    """Not a Kubernetes protobuf body of the expected shape."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtoError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(data: bytes) -> dict[int, list[Any]]:
    """A protobuf message -> {field number: [values]} (varints as int, length-delimited as bytes). Raises
    ProtoError."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ProtoError("truncated field")
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ProtoError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _str(msg: dict[int, list[Any]], number: int) -> str:
    values = msg.get(number)
    return values[-1].decode("utf-8") if values else ""


def _msg(msg: dict[int, list[Any]], number: int) -> dict[int, list[Any]] | None:
    values = msg.get(number)
    return fields(values[-1]) if values else None


def decode_review(body: bytes) -> dict[str, Any]:
    """A protobuf SelfSubjectAccessReview or SelfSubjectRulesReview -> the same object as JSON would carry it
    (kind, apiVersion, spec). Raises ProtoError."""
    if not body.startswith(MAGIC):
        raise ProtoError("no k8s protobuf magic")
    unknown = fields(body[len(MAGIC):])
    type_meta = _msg(unknown, 1) or {}
    kind = _str(type_meta, 2)
    obj = fields(unknown.get(2, [b""])[-1])
    spec = _msg(obj, 2) or {}
    out: dict[str, Any] = {"kind": kind, "apiVersion": _str(type_meta, 1)}
    if kind == "SelfSubjectRulesReview":
        out["spec"] = {"namespace": _str(spec, 1)}
    elif kind == "SelfSubjectAccessReview":
        if (attrs := _msg(spec, 1)) is not None:
            names = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
            out["spec"] = {"resourceAttributes": {n: v for i, n in enumerate(names, start=1)
                                                  if (v := _str(attrs, i))}}
        elif (non := _msg(spec, 2)) is not None:
            out["spec"] = {"nonResourceAttributes": {"path": _str(non, 1), "verb": _str(non, 2)}}
        else:
            out["spec"] = {}
    else:
        raise ProtoError(f"not a review: {kind or 'no kind'}")
    return out
