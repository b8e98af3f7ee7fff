"""The triage desk's `s`: save the selected finding's packets as pcapng, asked for a path (PathPrompt, which never
overwrites silently), written by the session (Session.save_evidence) in a worker. A mixin of MeshDoctorApp
(app.py), moved out of it to keep the module short."""

from __future__ import annotations

import asyncio
import os

from textual import work

from kubectl_meshdoctor.core.findings import PACKET, Finding

from .session import Session


class SaveKey:
    """The app's `s` key. The host sets ``session`` and ``selected`` (the finding shown) and is a Textual App."""

    session: Session
    selected: Finding | None

    def action_save(self, _twin: int = 0) -> None:
        f = self.selected
        if f is None:
            self.notify("select a finding first", severity="warning", markup=False)
            return
        if not self.session.saves_evidence:
            self.notify("this session keeps no capture bytes to save (watch --dissect pod leaves them in the pod)"
                        if self.session.live else "this session keeps no capture bytes to save", severity="error",
                        markup=False)
            return
        from .screens import PathPrompt

        first = next((e for e in f.evidence if e.frame and e.kind == PACKET), None)
        named = f", frame {first.frame}" if first is not None else ", no packet among its evidence"
        default = os.path.join(os.getcwd(), f"meshdoctor-{f.detector}-{first.frame if first else 'evidence'}.pcapng")
        where = f.flow.text(labelled=False)
        self.push_screen(PathPrompt(f"Save the packets of {f.detector}: {f.title}\n{where}{named}", default),
                         lambda answer: answer and self._save(f, *answer))

    @work(exit_on_error=False, group="save")
    async def _save(self, f: Finding, path: str, overwrite: bool) -> None:
        try:
            summary = await asyncio.to_thread(self.session.save_evidence, f, path, overwrite)
        except Exception as e:  # SaveError and OSError: one line on screen
            self.notify(f"not saved: {e}", severity="error", timeout=8, markup=False)
            return
        self.notify(summary, timeout=8, markup=False)
