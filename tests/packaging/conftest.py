"""scripts/build-krew started as soon as collection ends when a selected test needs its archive (test_krew.py's
``built``), so that its resolve and download (about two minutes in CI, mostly waiting on the package index)
overlap the other tests instead of holding their run up; the fixture then waits for it. Its directory is
removed, and the build ended if it still runs, when the session ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parent.parent.parent / "scripts" / "build-krew"


@dataclass
class KrewBuild:
    """A build under way: ``root`` holds home/, tmp/, out/ and its stdout and stderr files."""

    root: Path
    proc: subprocess.Popen
    started: float

    def wait(self, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
        """(the build's CompletedProcess, its seconds); raises subprocess.TimeoutExpired."""
        self.proc.wait(timeout=timeout)
        done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode,
                                           (self.root / "build.out").read_text(),
                                           (self.root / "build.err").read_text())
        return done, time.monotonic() - self.started


KREW_BUILD = pytest.StashKey[KrewBuild]()


def start_build(root: Path) -> KrewBuild:
    (root / "home").mkdir()
    (root / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEX_", "SHIV_"))}
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"))
    with open(root / "build.out", "w") as out, open(root / "build.err", "w") as err:
        proc = subprocess.Popen([str(BUILD), "-o", "out"], cwd=root, env=env, stdout=out, stderr=err)
    return KrewBuild(root, proc, time.monotonic())


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("built" in getattr(item, "fixturenames", ()) and item.path.name == "test_krew.py" for item in session.items):
        session.config.stash[KREW_BUILD] = start_build(Path(tempfile.mkdtemp(prefix="meshdoctor-krew-")))


def pytest_sessionfinish(session: pytest.Session) -> None:
    build = session.config.stash.get(KREW_BUILD, None)
    if build is None:
        return
    if build.proc.poll() is None:
        build.proc.kill()
        build.proc.wait(timeout=30)
    shutil.rmtree(build.root, ignore_errors=True)
