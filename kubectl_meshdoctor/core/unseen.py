"""What a run's packets could not show because one of the pod's two interfaces was not captured.

The detectors act on a pod's ``lo`` (the sidecar and the app, the app's REDIRECTed outbound SYNs) and ``eth0``
(the pod and the rest of the cluster); some failure classes cross only one of them. A run given ``lo.pcap`` alone
that says "no failure seen" must also say that what only ``eth0`` carries could not be seen, and the other way
round. Which class crosses which interface is each detector's own rule, and each declares it
(``Detector.unseen_without``: interface -> what a reader would miss; ``Detector.unseen_rank``: its place in the
line; docs/ADDING_A_DETECTOR.md): e.g. tuple_collision.py acts on the challenge ACK on eth0 (on lo it reads only
the app's REDIRECTed SYNs), conntrack_invalid.py returns at once on lo (the REDIRECT is in PREROUTING: only what
arrives on eth0 can miss it), upstream_refused.py and startup_ordering.py act on lo alone. This module reads the
run's loaded detectors' declarations, passed in (``missed_by``); it knows no detector.

A detector whose finding cannot name its cause asks the same of the packets read so far (``captured``, with
DetectorContext.by_iface; ``next_look`` words it): it says to capture an interface only when the run lacks it,
and else what in the captures given to look at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ROLES = ("lo", "eth0")


@dataclass(slots=True)
class IfaceStats:
    """The packets read of one interface: how many, the first's and the latest's time (seconds since the epoch)."""

    packets: int = 0
    first_ts: float | None = None
    last_ts: float | None = None


@dataclass(frozen=True, slots=True)
class Missed:
    """A failure class whose packets cross ``iface`` (lo or eth0) only: a run without that interface's packets
    misses ``what`` (a few words), the class of ``detector`` (its id)."""

    detector: str
    iface: str
    what: str


def missed_by(declared: Iterable[tuple[str, int, Mapping[str, str]]]) -> tuple[Missed, ...]:
    """The classes a run's detectors declare (``declared``: each one's id, ``Detector.unseen_rank`` and
    ``Detector.unseen_without``, in the detectors' load order; not the detectors, which import this module), by
    rank, lower first, then in that load order (core/registry.py: the built-in ones, then outside packages'), so
    a detector that gives no rank follows the built-ins and one that gives a built-in's follows it. An interface
    other than lo and eth0 is left out: no report could say it missing (tests/core/test_unseen_declared.py holds
    the built-ins to ROLES)."""
    ranked = [(rank, Missed(det, iface, what)) for det, rank, said in declared for iface, what in said.items()
              if iface in ROLES]
    return tuple(m for _, m in sorted(ranked, key=lambda rm: rm[0]))  # stable: load order among equal ranks


@dataclass(frozen=True, slots=True)
class Unseen:
    """One pod's missing interface: ``pod`` (None for the run's one unnamed pod), ``missing`` (lo or eth0, the
    interface no packet came from), ``classes`` ((detector id, what) pairs only it would show)."""

    pod: str | None
    missing: str
    classes: tuple[tuple[str, str], ...]

    def line(self) -> str:
        """One line for a text report: ``not seen: lo only (no eth0 packet), so none of ... could show; ...``."""
        whose = f"pod/{self.pod}: " if self.pod else ""
        have = "eth0" if self.missing == "lo" else "lo"
        what = ", ".join(w for _, w in self.classes)
        return (f"not seen: {whose}{have} only (no {self.missing} packet), so none of {what} could show; give "
                f"{self.missing} too")

    def to_dict(self) -> dict:
        return {**({"pod": self.pod} if self.pod else {}), "missing": self.missing,
                "classes": [{"detector": d, "what": w} for d, w in self.classes]}


def unseen(by_iface: dict[str, int], missed: Iterable[Missed]) -> list[Unseen]:
    """For the interfaces packets came from (``by_iface``: ``lo``/``eth0``, or ``pod/lo`` with several pods, ->
    packets analysed), each pod that had packets from one of lo and eth0 and none from the other, with the classes
    of ``missed`` (the run's detectors' declarations, ``missed_by``) only the other shows. A pod with neither (no
    packet at all) or both is not listed, nor one whose missing interface no loaded detector reads a class on;
    other interfaces (``any``, a stem) say nothing of either."""
    pods: dict[str | None, set[str]] = {}
    for key, packets in by_iface.items():
        pod, _, iface = key.rpartition("/")
        if packets and iface in ROLES:
            pods.setdefault(pod or None, set()).add(iface)
    declared = tuple(missed)
    classes = {iface: tuple((m.detector, m.what) for m in declared if m.iface == iface) for iface in ROLES}
    out: list[Unseen] = []
    for pod, seen in pods.items():
        if len(seen) == 1:
            missing = "eth0" if seen == {"lo"} else "lo"
            if classes[missing]:
                out.append(Unseen(pod, missing, classes[missing]))
    return out


def span(by_iface: Mapping[str, IfaceStats]) -> tuple[float, float] | None:
    """The span of the packets read of one pod (``by_iface``: interface -> its counts): the first's and the
    latest's time of any interface (seconds since the epoch), or None when none was read. What its captures could
    show of a request: one that began before it, or still ran after it, had a part no packet read could show."""
    read = [st for st in by_iface.values() if st.packets and st.first_ts is not None and st.last_ts is not None]
    if not read:
        return None
    return min(st.first_ts for st in read if st.first_ts is not None), max(
        st.last_ts for st in read if st.last_ts is not None)


def captured(by_iface: Mapping[str, IfaceStats], start: float | None = None,
             end: float | None = None) -> tuple[str, ...]:
    """Of one pod's lo and eth0 (in that order), those whose packets were read (``by_iface``: interface -> its
    counts, the pipeline's, as DetectorContext.by_iface gives them so far): what ``unseen`` does not call
    missing. With a time (``start`` to ``end``, seconds since the epoch; ``end`` None: ``start``), none when it
    lies wholly outside the span of the packets read (the first to the latest of any interface), as
    commands/outside_span.py judges a request: those captures could not show it. Not each interface's own span:
    the reader keeps only the packets a detector may act on, so a capture running all along may hold none read
    near the time."""
    read = span(by_iface)
    if start is not None and (read is None or read[0] > (start if end is None else end) or start > read[1]):
        return ()
    return tuple(i for i in ROLES if (st := by_iface.get(i)) is not None and st.packets)


def missing_of(given: tuple[str, ...]) -> str:
    """Of lo and eth0, those not in ``given``, in words: ``eth0 and lo``, ``eth0``, ``lo`` or ""."""
    return " and ".join(i for i in ("eth0", "lo") if i not in given)


def next_look(given: tuple[str, ...], look: Mapping[str, str], capture: str, then: str = "") -> str:
    """The advice closing a finding whose cause its evidence does not show: what to look at (``look``: interface
    -> where) in the captures ``given`` of the pod's lo and eth0 (``captured``), then what to capture next:
    ``capture`` with ``{}`` the interfaces not given (left out when none is missing), and ``then``, what no packet
    replaces (a debug log). "" when there is nothing to say."""
    said = (f"Look next in the capture{'s' * (len(given) > 1)} given of this pod's {' and '.join(given)} (no packet "
            f"finding explains it): {'; '.join(look[i] for i in given)}." if given else "")
    wanted = [w for w in (capture.format(missing_of(given)) if missing_of(given) else "", then) if w]
    return " ".join(w for w in (said, f"Capture next: {', and '.join(wanted)}." if wanted else "") if w)
