"""Files of ours that hold a capture's bytes (a copy of a live capture, a finding's saved packets): owner-only
(0600: the traffic's secrets are in them), and opened so that a link, a FIFO or another user's file planted
where one goes is refused. This may run as root, which must not write through a link someone planted. A leaf:
the live capture and the front ends both open their files here."""

from __future__ import annotations

import errno
import os
import stat


def owned(path: str) -> os.stat_result | None:
    """What is at ``path`` (None: nothing), unless it is a link or another user's: then OSError (its filename
    ``path``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "it is a symbolic link; refused", path)
    if st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"it belongs to another user (uid {st.st_uid}); refused", path)
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
    st = owned(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EPERM, "it is not a regular file; refused", path)
