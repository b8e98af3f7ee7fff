"""analyze's arguments as pods: a caller pod and a server pod each saw the same connections on their own eth0,
and one flow table fed both views makes failures that never happened. So each pod's files are read apart.

- ``DIR``: one pod, named after the directory; every regular file directly in it (no recursion), each kind
  told by its content (sources/files.py).
- ``FILE:POD/IFACE`` (or ``FILE:POD/``: the interface from the file's name or content): one file of pod POD.
- ``FILE``, ``FILE:IFACE``: with no pod named anywhere, every file is of one unnamed pod, as before pods
  were known; beside inputs that name pods, the file is of the pod named after its own directory (so
  ``analyze caller/ server/lo.pcap`` is two pods).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .files import CaptureArg, InputError, iface_from_name, names_iface


def pod_of_dir(path: str) -> str:
    """The pod a directory (or a file in it, by its parent) stands for: the directory's own name."""
    return os.path.basename(os.path.abspath(path)) or "/"


def _dir_files(path: str, pod: str) -> list[CaptureArg]:
    """Every regular file directly in directory ``path``, by name, as pod ``pod``'s. InputError (one line)
    when it cannot be listed or holds none."""
    try:
        with os.scandir(path) as it:
            names = sorted(e.name for e in it if e.is_file())  # follows links: a link to a file is that file
    except OSError as e:
        raise InputError(f"{path}: cannot list: {e.strerror or e}") from None
    if not names:
        raise InputError(f"{path}: no file in it (a pod's directory holds its captures, Envoy logs and dumps)")
    files = [os.path.join(path, n) for n in names]
    return [CaptureArg(f, iface_from_name(f), False, pod, names_iface(f)) for f in files]


def pod_inputs(argv: Sequence[str]) -> list[CaptureArg]:
    """Each input file of ``argv`` (the arguments above) once, with its pod (None for all when no argument
    names one). Raises InputError (one line) for a directory that holds no file or cannot be listed, and for
    two directories of one name (two pods would be read as one)."""
    out: list[CaptureArg] = []
    dirs: dict[str, str] = {}  # pod -> the directory it was named after
    for arg in argv:
        if os.path.isdir(arg):
            pod = pod_of_dir(arg)
            other = dirs.setdefault(pod, arg)
            if other != arg and not os.path.samefile(other, arg):
                raise InputError(f"{other} and {arg} would both be pod {pod}: give one as FILE:POD/IFACE "
                                 f"arguments with a pod name of its own")
            out += _dir_files(arg, pod)
        else:
            out.append(CaptureArg.parse(arg))
    if any(a.pod is not None for a in out):
        out = [a if a.pod is not None else a.in_pod(pod_of_dir(os.path.dirname(a.path) or ".")) for a in out]
    return list(dict.fromkeys(out))  # a file given twice counts once


def by_pod(args: Sequence[CaptureArg]) -> list[tuple[str | None, list[CaptureArg]]]:
    """``args`` grouped by pod, pods in the order first given."""
    groups: dict[str | None, list[CaptureArg]] = {}
    for a in args:
        groups.setdefault(a.pod, []).append(a)
    return list(groups.items())
