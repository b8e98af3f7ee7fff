"""Our private directories (mode 0700) in TMPDIR: what a run keeps there is removed by the next run when the
one that made it is gone (SIGKILL, a crash). Chunks of a big capture and the TUI's spool hold capture bytes; the
Kubernetes client's copies of a kubeconfig's certificate and key hold key material. None of it is anybody's to
keep."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

PRIVATE_KINDS = ("chunks", "spool", "kube")


def private_dir_prefix(kind: str) -> str:
    """The prefix of this process's private directories of ``kind`` (PRIVATE_KINDS): who made one is in its
    name, so a later run can tell those of a process that is gone."""
    return f".meshdoctor-{kind}-{os.getpid()}-"


def remove_stale_private_dirs(directory: str | None = None) -> list[str]:
    """Remove the private directories in ``directory`` (and TMPDIR) that a process of ours made and did not
    live to remove (SIGKILL, a crash): they hold capture bytes nobody asked to keep. Returns what it removed.
    Another user's, and a live process's, are left alone."""
    removed = []
    try:
        tmp = tempfile.gettempdir()
    except OSError:  # no usable temporary directory: nothing of ours can be in one
        tmp = None
    for parent in dict.fromkeys(d for d in (directory, tmp) if d):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"\.meshdoctor-(?:" + "|".join(PRIVATE_KINDS) + r")-(\d+)-\w+", name)
            path = os.path.join(parent, name)
            if not m or not os.path.isdir(path) or os.stat(path).st_uid != os.getuid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
                continue  # its maker still runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # a live process of someone else
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
