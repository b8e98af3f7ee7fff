"""Finds detectors: every class registered under the entry-point group ``kubectl_meshdoctor.detectors``.

The built-ins (the top-level ``plugins/``, installed as ``kubectl_meshdoctor_plugins``) are registered in this
package's own pyproject.toml exactly as an outside package registers its own, so there is one way to find a
detector. An entry point's name is the detector id; its object is the ``Detector`` subclass.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

from .detector import Detector, DetectorContext, kinds_mask

ENTRY_POINT_GROUP = "kubectl_meshdoctor.detectors"
DISTRIBUTION = "kubectl-meshdoctor"
# Ids the core itself gives findings (correlate.py: a failing access-log line nothing explains).
RESERVED_IDS = frozenset({"access-log"})


class UnknownDetectorError(ValueError):
    """A detector id was asked for that no plugin provides."""


class DetectorLoadError(RuntimeError):
    """A registered detector could not be loaded (an import error, or not a Detector subclass); the message is
    one line naming the entry point."""


def _builtin_first(ep: EntryPoint) -> int:
    dist = getattr(ep, "dist", None)
    return 0 if dist is not None and dist.name == DISTRIBUTION else 1


def available_detectors() -> dict[str, type[Detector]]:
    """Every detector class by id: this distribution's first, then outside packages', which cannot shadow a
    built-in id (the first registration of an id wins) nor take one of RESERVED_IDS.

    Raises DetectorLoadError when a registered detector fails to import, is not a Detector with that id, or
    declares a packet kind core/detector.py does not know (PACKET_KINDS).
    """
    found: dict[str, type[Detector]] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_builtin_first):
        if ep.name in found or ep.name in RESERVED_IDS:
            continue
        try:
            obj = ep.load()
        except Exception as e:  # any import-time failure of a plugin is that plugin's, named in one line
            raise DetectorLoadError(f"detector {ep.name} ({ep.value}) failed to load: "
                                    f"{type(e).__name__}: {e}") from None
        if not (isinstance(obj, type) and issubclass(obj, Detector) and obj.id == ep.name):
            raise DetectorLoadError(f"detector {ep.name} ({ep.value}) is not a Detector subclass with id "
                                    f"{ep.name!r}")
        try:  # checked here, not at the run's first packet (a misspelt kind would starve the detector)
            kinds = obj.packet_kinds
            if not hasattr(kinds, "__get__"):  # a property is read on the instance, by the pipeline, as before
                kinds_mask(kinds)
        except (TypeError, ValueError) as e:
            raise DetectorLoadError(f"detector {ep.name} ({ep.value}) declares packet_kinds it cannot have: "
                                    f"{e}") from None
        found[ep.name] = obj
    return found


def load_detectors(ctx: DetectorContext, only: Iterable[str] | None = None) -> list[Detector]:
    """Instantiate detectors (all, or the ids in ``only``). Raises UnknownDetectorError for an unknown id,
    DetectorLoadError as available_detectors does."""
    classes = available_detectors()
    ids = list(classes) if only is None else list(only)
    missing = [i for i in ids if i not in classes]
    if missing:
        raise UnknownDetectorError(f"unknown detector {', '.join(missing)}; known: {', '.join(sorted(classes))}")
    return [classes[i](ctx) for i in ids]
