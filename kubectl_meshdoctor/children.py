"""Child processes that end with us: the kernel kills them when this process dies, however it dies.

A SIGKILL leaves no time to end a child ourselves, and an editcap left running goes on writing a copy of the
user's capture. Linux's prctl(PR_SET_PDEATHSIG) (man 2 prctl) asks the kernel to send the child a signal when
its parent thread exits; it is set in the child between fork and exec.
"""

from __future__ import annotations

import ctypes
import functools
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library of this process, loaded once (in the parent: see ``die_with_parent``)."""
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(lib: ctypes.CDLL) -> None:
    """In a child before exec: the kernel SIGKILLs it when we die. ``lib`` is loaded in the parent (``libc()``):
    a dlopen in the forked child could wait forever on a loader lock another thread held at the fork."""
    lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def dying_with_us() -> Callable[[], None]:
    """A ``preexec_fn`` for subprocess and asyncio.create_subprocess_exec: the child dies with this process."""
    return functools.partial(die_with_parent, libc())
