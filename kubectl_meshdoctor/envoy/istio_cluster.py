"""Istio's Envoy cluster names: ``DIRECTION|PORT|SUBSET|HOST``.

istiod names the cluster of a service port ``outbound|PORT|SUBSET|HOST`` (a caller's, a gateway's) and a
sidecar's own inbound cluster ``inbound|PORT||`` (istio/istio pilot/pkg/model/service.go ``BuildSubsetKey`` and
``ParseSubsetKey``; Istio < 1.10 wrote ``inbound|PORT|PORTNAME|HOST``). The access log's %UPSTREAM_CLUSTER% and
every ``cluster.NAME.*`` stat carry it, so it tells which hop a line was logged at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"(inbound|outbound)\|(\d{0,5})\|([^|\s]*)\|([^|\s]*)")


@dataclass(frozen=True, slots=True)
class IstioCluster:
    """``direction`` ``inbound`` or ``outbound``; ``port`` the service port (None when not printed);
    ``subset`` (a DestinationRule subset, "" for none); ``host`` the service's FQDN ("" for an inbound
    cluster of Istio >= 1.10)."""

    direction: str
    port: int | None
    subset: str
    host: str

    @property
    def service(self) -> str | None:
        """The Service's name, from ``NAME.NAMESPACE.svc.DOMAIN``; None for a host of another shape."""
        parts = self.host.split(".")
        return parts[0] if len(parts) >= 3 and parts[2] == "svc" else None

    @property
    def namespace(self) -> str | None:
        """The Service's namespace, from ``NAME.NAMESPACE.svc.DOMAIN``; None for a host of another shape."""
        parts = self.host.split(".")
        return parts[1] if len(parts) >= 3 and parts[2] == "svc" else None


def parse_istio_cluster(name: str | None) -> IstioCluster | None:
    """``outbound|9080|v1|reviews.default.svc.cluster.local`` -> IstioCluster; None for any other cluster
    (``PassthroughCluster``, ``BlackHoleCluster``, a name of the user's own). Never raises."""
    m = _NAME.fullmatch(name or "")
    if m is None:
        return None
    return IstioCluster(m.group(1), int(m.group(2)) if m.group(2) else None, m.group(3), m.group(4))
