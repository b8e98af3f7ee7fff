"""The copies a live capture keeps on request (``--write-pcap``) or for the TUI (its private spool): where they go,
and how they are opened. This runs as root, and a link planted where a capture goes must not be written
through, nor a FIFO opened, nor another user's file replaced."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


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
    st = _owned(str(path))
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "it is not a directory; refused")


def _owned(path: str) -> os.stat_result | None:
    """What is at ``path`` (None: nothing), unless it is a link or another user's: then OSError."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "it is a symbolic link; refused")
    if st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"it belongs to another user (uid {st.st_uid}); refused")
    return st


def open_copy(path: str, replace: bool = False):
    """Open ``path`` for a capture's copy, owner-only (0600: it holds the traffic's secrets), unbuffered. A
    symbolic link there is refused whatever ``replace`` says (O_NOFOLLOW: root must not write through a link
    someone planted); an existing file is refused unless ``replace`` (O_EXCL). Raises OSError."""
    if replace:
        replaceable(path)
        try:
            os.unlink(path)  # a new file, ours and 0600: truncating would keep the old one's owner and mode
        except FileNotFoundError:
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        return os.fdopen(fd, "wb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def replaceable(path: str) -> None:
    """Raise OSError unless what is at ``path`` (if anything) is a regular file of this user's, the only kind
    --overwrite replaces: not a link (root writing through a planted one), not a FIFO (opening it would hang, and
    whoever reads it would get the capture), not another user's file (they could read it back)."""
    st = _owned(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EPERM, "it is not a regular file; refused")


def copy_refusal(e: OSError, path: str) -> str:
    """Why ``open_copy`` refused ``path``, in one line."""
    if e.errno == errno.ELOOP or os.path.islink(path):
        return "it is a symbolic link; refused"
    if e.errno == errno.EPERM and e.strerror and e.strerror.startswith("it "):
        return e.strerror
    if os.path.isdir(path):
        return os.strerror(errno.EISDIR)
    if e.errno == errno.EEXIST:
        return "it exists (give --overwrite to replace it)"
    return e.strerror or str(e)
