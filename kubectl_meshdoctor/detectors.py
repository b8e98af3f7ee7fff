"""The detector API and the registry that finds detectors.

A detector is one module in ``kubectl_meshdoctor/plugins/`` (or a class another package registers under the
entry-point group ``kubectl_meshdoctor.detectors``). It consumes events, keeps its own bounded state and returns
findings. It imports neither the TUI, the Kubernetes client nor pyshark.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import ClassVar

from .events import ContextEvent, PacketEvent, RedirectMap
from .findings import Finding
from .flows import Flow, FlowTable

ENTRY_POINT_GROUP = "kubectl_meshdoctor.detectors"


@dataclass(slots=True)
class DetectorContext:
    """What every detector may read: the shared flow table and what is known about the pod."""

    flows: FlowTable
    redirect_map: RedirectMap = field(default_factory=RedirectMap)
    pod: str | None = None
    redact: bool = True  # hide secret header values in evidence (DESIGN.md, privacy); --no-redact turns it off


class Detector:
    """Base class. Subclasses set ``id`` (stable, part of the report contract) and override the hooks they need.

    Hooks return an iterable of findings (empty when nothing is concluded). ``on_packet`` is called after the
    flow table has seen the packet; ``flow`` is that packet's flow. ``on_tick`` gets the newest packet time
    (seconds) so detectors can conclude on silence (an unanswered SYN); ``finish`` is called once at the end.
    """

    id: ClassVar[str] = ""
    # The cluster stats (names after `cluster.<name>.`) that real Envoy moves on the inbound cluster of the
    # finding's server port when this failure happens; the report attaches those that moved during the run.
    envoy_counters: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: DetectorContext) -> None:
        self.ctx = ctx

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        return ()

    def on_context(self, ev: ContextEvent) -> Iterable[Finding]:
        return ()

    def on_tick(self, now: float) -> Iterable[Finding]:
        return ()

    def finish(self) -> Iterable[Finding]:
        return ()


class UnknownDetectorError(ValueError):
    """A detector id was asked for that no plugin provides."""


def available_detectors() -> dict[str, type[Detector]]:
    """Every detector class by id: the built-in plugins first, then entry points (which cannot shadow them).

    Raises ImportError when a built-in plugin fails to import (a packaging bug we want to see).
    """
    from . import plugins

    found: dict[str, type[Detector]] = {}
    for mod in pkgutil.iter_modules(plugins.__path__, plugins.__name__ + "."):
        module = importlib.import_module(mod.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Detector) and obj is not Detector and obj.id:
                found.setdefault(obj.id, obj)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, Detector) and obj.id:
            found.setdefault(obj.id, obj)
    return found


def load_detectors(ctx: DetectorContext, only: Iterable[str] | None = None) -> list[Detector]:
    """Instantiate detectors (all, or the ids in ``only``). Raises UnknownDetectorError for an unknown id."""
    classes = available_detectors()
    ids = list(classes) if only is None else list(only)
    missing = [i for i in ids if i not in classes]
    if missing:
        raise UnknownDetectorError(f"unknown detector {', '.join(missing)}; known: {', '.join(sorted(classes))}")
    return [classes[i](ctx) for i in ids]


class PendingSyns:
    """Connection attempts a detector waits on, keyed by (iface, client, server), bounded in count and age.

    ``max_items``: the oldest attempt goes first when full; ``ttl_s``: ``expire(now)`` drops attempts whose SYN
    is older than this (packet time, seconds). Values must have a ``syn`` PacketEvent attribute.
    """

    def __init__(self, max_items: int = 10_000, ttl_s: float = 60.0) -> None:
        self.max_items = max_items
        self.ttl_s = ttl_s
        self._items: dict = {}

    @staticmethod
    def key_of_syn(ev: PacketEvent) -> tuple:
        return (ev.iface, (ev.src, ev.sport), (ev.dst, ev.dport))

    @staticmethod
    def key_of_answer(ev: PacketEvent) -> tuple:
        """The attempt a packet from the server answers: it travels server -> client."""
        return (ev.iface, (ev.dst, ev.dport), (ev.src, ev.sport))

    def get(self, key):
        return self._items.get(key)

    def add(self, key, value) -> None:
        if len(self._items) >= self.max_items and key not in self._items:
            self._items.pop(next(iter(self._items)))
        self._items[key] = value

    def pop(self, key) -> None:
        self._items.pop(key, None)

    def values(self) -> list:
        return list(self._items.values())

    def expire(self, now: float) -> None:
        for k in [k for k, v in self._items.items() if now - v.syn.ts > self.ttl_s]:
            del self._items[k]
