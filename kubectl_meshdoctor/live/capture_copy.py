"""The copies a live capture keeps on request (``--write-pcap``) or for the TUI (its private spool): where they go,
and how they are opened. This runs as root, and a link planted where a capture goes must not be written
through, nor a FIFO opened, nor another user's file replaced."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kubectl_meshdoctor.private_files import open_copy, owned, replaceable

__all__ = ["copy_refusal", "open_copy", "pcap_path", "pod_pcap_dir", "replaceable", "usable_pod_dir"]


def pcap_path(directory: Path, pod: str, iface: str) -> Path:
    """Where --write-pcap (and the TUI's spool) keeps the capture of ``pod``'s ``iface``."""
    return directory / f"{pod}-{iface}.pcap"


def pod_pcap_dir(directory: Path, pod: str, several: bool) -> Path:
    """The directory --write-pcap ``directory`` keeps pod ``pod``'s captures in: a subdirectory named after the
    pod when the watch captures ``several`` pods, so ``analyze DIR`` (a folder of pod folders,
    sources/pod_inputs.py) reads each back as the pod it was, not all as one; ``directory`` itself for one pod,
    as it always was (``analyze DIR`` reads that one pod)."""
    return directory / pod if several else directory


def usable_pod_dir(path: Path) -> None:
    """Raise OSError unless ``path`` is absent or a directory of this user's that is not a link: root must not
    write a pod's captures through a link someone planted where its subdirectory goes, nor into another user's
    directory (they could swap the files)."""
    st = owned(str(path))
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "it is not a directory; refused")


def copy_refusal(e: OSError, path: str) -> str:
    """Why ``open_copy`` (private_files.py) refused ``path``, in one line."""
    if e.errno == errno.ELOOP or os.path.islink(path):
        return "it is a symbolic link; refused"
    if e.errno == errno.EPERM and e.strerror and e.strerror.startswith("it "):
        return e.strerror
    if os.path.isdir(path):
        return os.strerror(errno.EISDIR)
    if e.errno == errno.EEXIST:
        return "it exists (give --overwrite to replace it)"
    return e.strerror or str(e)
