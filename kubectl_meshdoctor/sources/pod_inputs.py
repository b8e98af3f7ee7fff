"""analyze's arguments as pods: a caller pod and a server pod each saw the same connections on their own eth0,
and one flow table fed both views makes failures that never happened. So each pod's files are read apart.

- ``DIR``: one pod, named after the directory; every regular file directly in it (no recursion), each kind
  told by its content (sources/files.py). A directory that holds no file but directories (``watch --write-pcap
  DIR`` over several pods writes one a pod) is a folder of pods: each of those is a pod, named after it.
- ``FILE:POD/IFACE`` (or ``FILE:POD/``: the interface from the file's name or content): one file of pod POD.
- ``FILE``, ``FILE:IFACE``: with no pod named anywhere, every file is of one unnamed pod, as before pods
  were known; beside inputs that name pods, the file is of the pod named after its own directory (so
  ``analyze caller/ server/lo.pcap`` is two pods).
- A log whose lines carry ``kubectl logs --prefix``'s ``[pod/NAME/CONTAINER]`` or stern's ``POD CONTAINER``
  (sources/log_pods.py): its lines go to the pods they name when it names several, or when it is a plain FILE
  beside inputs that name pods; the lines that name none stay with the file's own pod.

A pod name given by a directory (a DIR, or the directory of a plain FILE beside pods) is that directory's: two
directories of one name would be two pods read as one, and are refused. A name the user gives (``FILE:POD/``) or
a log's wrapper gives joins the pod of that name, whatever gave it first: the report lists each pod's files. A
file of a DIR that is also given as ``FILE:POD/`` is pod POD's only.

What a DIR holds that is not read (a directory, a pipe, socket or device, a link to nothing or a link loop) is
said, one ``Problem`` an entry; a FIFO is never opened (a read would block, and take the bytes of its writer).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from kubectl_meshdoctor.core.findings import Problem

from .files import CaptureArg, InputError, iface_from_name, names_iface
from .log_pods import log_pods


@dataclass(frozen=True, slots=True)
class PodInputs:
    """``files``: each input file once with its pod (a several-pod log once a pod); ``skipped``: what was given
    or found in a DIR and is not read, one problem each."""

    files: tuple[CaptureArg, ...]
    skipped: tuple[Problem, ...] = ()


def pod_of_dir(path: str) -> str:
    """The pod a directory (or a file in it, by its parent) stands for: the directory's own name."""
    return os.path.basename(os.path.abspath(path)) or "/"


def _not_read(path: str, st: os.stat_result | None, err: OSError | None) -> str | None:
    """Why directory entry ``path`` (its stat ``st``, or the error stat gave) is not read, or None: a file."""
    if err is not None:
        if err.errno == errno.ELOOP:
            return "a symbolic link loop: not read"
        if err.errno == errno.ENOENT:
            return f"a symbolic link to nothing ({os.readlink(path) if os.path.islink(path) else '?'}): not read"
        return f"cannot read: {err.strerror or err}"
    assert st is not None
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "a directory: not read (a pod's directory is read without recursion; give it as a pod of its own)"
    return "not a regular file (a pipe, socket or device): not read"


def _entries(path: str) -> list[tuple[str, os.stat_result | None, OSError | None]]:
    """Each entry of directory ``path`` by name, with its stat (links followed) or the error it gave. InputError
    (one line) when the directory cannot be listed."""
    try:
        with os.scandir(path) as it:
            names = sorted(e.name for e in it)
    except OSError as e:
        raise _NoFiles(f"{path}: cannot list: {e.strerror or e}") from None
    out: list[tuple[str, os.stat_result | None, OSError | None]] = []
    for n in names:
        full = os.path.join(path, n)
        try:
            out.append((full, os.stat(full), None))  # stat opens nothing: a FIFO stays unread
        except OSError as e:
            out.append((full, None, e))
    return out


class _NoFiles(InputError):
    """A directory that cannot be listed or holds no file: a problem of the run while other inputs are read."""


class _Pods:
    """The pods named so far and what named each: the directory it stands for, or None for a name given."""

    def __init__(self) -> None:
        self.by_dir: dict[str, str] = {}  # pod -> the directory it was named after

    def by_directory(self, pod: str, directory: str) -> None:
        other = self.by_dir.setdefault(pod, directory)
        if other != directory and not os.path.samefile(other, directory):
            raise InputError(f"{other} and {directory} would both be pod {pod}: give one's files as "
                             f"FILE:POD/IFACE arguments with a pod name of its own")


def _dir_pods(path: str, pods: _Pods, skipped: list[Problem]) -> list[CaptureArg]:
    """The files of DIR ``path``: one pod's, or each subdirectory's of a folder of pods (no file, directories)."""
    entries = _entries(path)
    regular = [p for p, st, err in entries if _not_read(p, st, err) is None]
    subdirs = [p for p, st, _ in entries if st is not None and stat.S_ISDIR(st.st_mode)]
    if not regular and subdirs:
        out: list[CaptureArg] = []
        for d in subdirs:
            try:
                out += _dir_pods_one(d, pods, skipped, _entries(d))
            except _NoFiles as e:
                skipped.append(Problem(d, str(e).removeprefix(f"{d}: ")))
        return out
    return _dir_pods_one(path, pods, skipped, entries)


def _dir_pods_one(path: str, pods: _Pods, skipped: list[Problem],
                  entries: list[tuple[str, os.stat_result | None, OSError | None]]) -> list[CaptureArg]:
    pod = pod_of_dir(path)
    pods.by_directory(pod, path)
    files: list[str] = []
    for p, st, err in entries:
        why = _not_read(p, st, err)
        if why is None:
            files.append(p)
        else:
            skipped.append(Problem(p, why))
    if not files:
        held = f" (it holds {len(entries)} entries, none a regular file)" if entries else ""
        raise _NoFiles(f"{path}: no file in it{held} (a pod's directory holds its captures, Envoy logs and "
                       f"dumps)")
    return [CaptureArg(f, iface_from_name(f), False, pod, names_iface(f)) for f in files]


def _top(arg: str) -> str | None:
    """Why argument ``arg`` cannot be read at all (a link loop), or None. A missing file is the reader's to say."""
    try:
        os.stat(arg)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop: not read"
    return None


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pod_inputs(argv: Sequence[str]) -> PodInputs:
    """Each input file of ``argv`` (the arguments above) once, with its pod (None for all when no argument
    names one); a directory that holds no file or cannot be listed is a problem (``skipped``) and the rest is
    read. Raises InputError (one line) for ``-`` (stdin is not read: the line says to save it to a file), for
    two directories of one name (two pods would be read as one), for ``FILE:WORD`` with WORD no interface name
    (CaptureArg.parse), and when no argument is left to read."""
    if any(CaptureArg.parse(arg).path == "-" and not os.path.exists(arg) for arg in argv):
        # Each input is read by path, more than once (its head for its kind, then tshark or the log reader, the
        # reader again to interleave by time), as /dev/stdin is refused by files.py: stdin is not read at all.
        raise InputError("-: analyze reads files, not standard input: save it to a file first and name the file "
                         "(analyze ticket.txt)")
    out: list[CaptureArg] = []
    skipped: list[Problem] = []
    pods = _Pods()
    in_dirs: set[int] = set()  # id() of the args a DIR gave
    for arg in argv:
        why = _top(arg)
        if why is not None:
            skipped.append(Problem(arg, why))
        elif os.path.isdir(arg):
            try:
                found = _dir_pods(arg, pods, skipped)
            except _NoFiles as e:  # a pod none of whose files can be read: the others still are
                skipped.append(Problem(arg, str(e).removeprefix(f"{arg}: ")))
                continue
            in_dirs.update(map(id, found))
            out += found
        else:
            out.append(CaptureArg.parse(arg))
    # A file of a DIR the user also gave a pod of its own (FILE:POD/) is that pod's only: the user said so.
    given = {_identity(a.path) for a in out if id(a) not in in_dirs and a.pod is not None} - {None}
    out = [a for a in out if id(a) not in in_dirs or _identity(a.path) not in given]
    if not out:
        raise InputError("; ".join(p.line() for p in skipped))
    out = _by_log_pods(out, any(a.pod is not None for a in out))
    if any(a.pod is not None for a in out):
        placed = []
        for a in out:
            if a.pod is None:
                directory = os.path.dirname(a.path) or "."
                a = a.in_pod(pod_of_dir(directory))
                pods.by_directory(a.pod, directory)
            placed.append(a)
        out = placed
    return PodInputs(tuple(dict.fromkeys(out)), tuple(skipped))  # a file given twice counts once


def _by_log_pods(args: list[CaptureArg], pods_named: bool) -> list[CaptureArg]:
    """``args`` with each log of several pods' lines (kubectl --prefix, stern) read once a pod it names (the
    module's rule): one of a DIR, or one the user gave a pod (``FILE:POD/``), is split only when it names several."""
    out: list[CaptureArg] = []
    for a in args:
        named = log_pods(a.path)
        given_pod = a.pod is not None
        if not named.pods or (len(named.pods) == 1 and (given_pod or not pods_named)):
            out.append(a)
            continue
        if named.others:  # its lines that name no pod stay with the file's own pod
            out.append(CaptureArg(a.path, a.iface, a.explicit, a.pod, a.named, except_pods=frozenset(named.pods)))
        out += [a.lines_of(p) for p in named.pods]
    return out


def by_pod(args: Sequence[CaptureArg]) -> list[tuple[str | None, list[CaptureArg]]]:
    """``args`` grouped by pod, pods in the order first given."""
    groups: dict[str | None, list[CaptureArg]] = {}
    for a in args:
        groups.setdefault(a.pod, []).append(a)
    return list(groups.items())
