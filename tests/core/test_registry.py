"""Detectors are found one way: the entry-point group ``kubectl_meshdoctor.detectors``. The built-ins are
registered there by this package's metadata exactly as an outside package registers its own; here an outside
distribution is installed the way pip leaves one (a dist-info with entry_points.txt on sys.path)."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.core.registry import (
    ENTRY_POINT_GROUP,
    DetectorLoadError,
    UnknownDetectorError,
    available_detectors,
)

from ..helpers import A, R, S, Wire, run

PLUGINS_DIR = Path(__file__).resolve().parent.parent.parent / "plugins"

OUTSIDE_DETECTOR = '''
from kubectl_meshdoctor.core.detector import Detector
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity


class AnyReset(Detector):
    """Flags every RST on eth0: enough to see that an outside detector runs in the pipeline."""

    id = "any-reset"
    kernel_counters = ("TcpOutRsts",)

    def on_packet(self, ev, flow):
        if not ev.is_rst or ev.iface != "eth0":
            return ()
        return (Finding(self.id, Severity.WARNING, "a reset", FlowRef(ev.src_endpoint, ev.dst_endpoint, ev.iface),
                        (Evidence.of(ev, "RST"),), pod=self.ctx.pod, ts=ev.ts),)


class Impostor(Detector):
    id = "tuple-collision"  # a built-in's id: it must not replace the built-in
'''


def _install_outside(tmp_path: Path, monkeypatch, entries: dict[str, str], module: str = OUTSIDE_DETECTOR) -> None:
    """An installed distribution ``meshdoctor-extra`` with module ``meshdoctor_extra`` and ``entries``."""
    (tmp_path / "meshdoctor_extra.py").write_text(module)
    info = tmp_path / "meshdoctor_extra-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: meshdoctor-extra\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n"
                                           + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "meshdoctor_extra", raising=False)


def test_every_built_in_is_registered_as_an_entry_point_and_loads():
    modules = sorted(p.stem for p in PLUGINS_DIR.glob("*.py") if p.stem != "__init__")
    ours = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.dist and ep.dist.name == "kubectl-meshdoctor"]
    assert sorted(ep.module.rsplit(".", 1)[1] for ep in ours) == modules
    for ep in ours:
        cls = ep.load()
        assert ep.module.startswith("kubectl_meshdoctor_plugins.")
        assert issubclass(cls, Detector) and cls.id == ep.name
    assert set(available_detectors()) >= {ep.name for ep in ours}


def test_an_outside_package_adds_a_detector_that_runs_but_cannot_shadow_a_built_in(tmp_path, monkeypatch):
    _install_outside(tmp_path, monkeypatch, {"any-reset": "meshdoctor_extra:AnyReset",
                                             "tuple-collision": "meshdoctor_extra:Impostor"})
    found = available_detectors()
    assert found["any-reset"].__module__ == "meshdoctor_extra"
    assert found["tuple-collision"].__module__ == "kubectl_meshdoctor_plugins.tuple_collision"
    w = Wire(iface="eth0")
    w.pkt("198.18.0.1:40000", "198.18.0.2:5000", S, 1)
    w.pkt("198.18.0.2:5000", "198.18.0.1:40000", R | A, 0, 2)
    (f,) = run(w.events, only=["any-reset"])
    assert f.detector == "any-reset" and [e.frame for e in f.evidence] == [2]
    # Its declared kernel counters back its findings like a built-in's.
    from kubectl_meshdoctor.core.events import KernelCountersEvent

    p = Pipeline.with_detectors(only=["any-reset"])
    for ev in w.events:
        p.feed(ev)
    p.context(KernelCountersEvent(0.0, {"TcpOutRsts": 3, "TcpEstabResets": 1}))
    (g,) = p.finish()
    assert g.counters == {"kernel.TcpOutRsts": 3}


def test_a_broken_outside_detector_is_named_in_one_line(tmp_path, monkeypatch):
    _install_outside(tmp_path, monkeypatch, {"broken": "meshdoctor_extra:AnyReset"}, module="import nosuchmodule\n")
    with pytest.raises(DetectorLoadError) as e:
        available_detectors()
    assert str(e.value) == ("detector broken (meshdoctor_extra:AnyReset) failed to load: ModuleNotFoundError: "
                            "No module named 'nosuchmodule'")


def test_an_entry_point_whose_id_differs_from_its_class_is_refused(tmp_path, monkeypatch):
    _install_outside(tmp_path, monkeypatch, {"reset": "meshdoctor_extra:AnyReset"})
    with pytest.raises(DetectorLoadError, match="not a Detector subclass with id 'reset'"):
        available_detectors()


@pytest.mark.parametrize("kinds, said", [
    ('frozenset({"syn", "htpp"})', "unknown packet kind(s) ['htpp']"),
    ('"http"', "unknown packet kind(s) ['h', 'p', 't']"),  # a string, not a set of names
    ("42", "'int' object is not iterable"),
])
def test_a_detector_declaring_a_packet_kind_nobody_knows_is_refused_when_it_loads(tmp_path, monkeypatch, kinds,
                                                                                    said):
    _install_outside(tmp_path, monkeypatch, {"any-reset": "meshdoctor_extra:AnyReset"},
                     module=OUTSIDE_DETECTOR.replace('    kernel_counters = ("TcpOutRsts",)\n',
                                                     f'    kernel_counters = ("TcpOutRsts",)\n    packet_kinds = {kinds}\n'))
    with pytest.raises(DetectorLoadError) as e:
        available_detectors()
    assert str(e.value).startswith("detector any-reset (meshdoctor_extra:AnyReset) declares packet_kinds it cannot "
                                   "have: ")
    assert said in str(e.value)
    assert "\n" not in str(e.value)


def test_a_detector_whose_packet_kinds_is_a_property_still_loads(tmp_path, monkeypatch):
    """A property is read on the instance when the pipeline dispatches, as it was before the load-time check."""
    _install_outside(tmp_path, monkeypatch, {"any-reset": "meshdoctor_extra:AnyReset"},
                     module=OUTSIDE_DETECTOR.replace('    kernel_counters = ("TcpOutRsts",)\n',
                                                     '    kernel_counters = ("TcpOutRsts",)\n\n    @property\n'
                                                     '    def packet_kinds(self):\n        return frozenset({"rst"})\n'))
    assert "any-reset" in available_detectors()
    w = Wire(iface="eth0")
    w.pkt("198.18.0.1:40000", "198.18.0.2:5000", S, 1)
    w.pkt("198.18.0.2:5000", "198.18.0.1:40000", R | A, 0, 2)
    (f,) = run(w.events, only=["any-reset"])
    assert [e.frame for e in f.evidence] == [2]


def test_an_unknown_id_names_the_known_ones():
    with pytest.raises(UnknownDetectorError, match="unknown detector nope; known: .*tuple-collision"):
        Pipeline.with_detectors(only=["nope"])


def test_an_outside_detector_cannot_take_the_core_s_own_id(tmp_path, monkeypatch):
    """``access-log`` findings come from the correlator (core); a plugin under that id would be mistaken for it."""
    _install_outside(tmp_path, monkeypatch, {"access-log": "meshdoctor_extra:AnyReset",
                                             "any-reset": "meshdoctor_extra:AnyReset"})
    found = available_detectors()
    assert "access-log" not in found and "any-reset" in found
