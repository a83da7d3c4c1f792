"""A spinner that shows an agent's setup as it runs, while `POST /api/sessions` waits for it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.markup import escape
from rich.status import Status

from ashd.cli._http import Remote
from ashd.cli._output import errors

POLL_SECONDS = 0.5
_SHOWN = 90  # characters of the newest setup line shown beside the spinner


def _starting(client: Remote, agent: str) -> set[str]:
    rows = client.call("GET", "/api/sessions", params={"agent": agent})["sessions"]
    return {str(r["id"]) for r in rows if r.get("status") == "starting"}


def _newest_index(client: Remote, session_id: str) -> int:
    after = -1
    while True:
        lines = client.call("GET", f"/api/sessions/{session_id}/logs", params={"after": after, "limit": 1000})["logs"]
        if not lines:
            return after
        after = int(lines[-1]["index"])


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


class _Watcher(threading.Thread):
    """Finds the session being created (the request answers only once its setup is over, so its id
    is not known yet: it is the agent's `starting` session that was not there before) and puts the
    newest line of its logs beside the spinner."""

    def __init__(self, client: Remote, agent: str, before: set[str], status: Status, what: str) -> None:
        super().__init__(daemon=True)
        self.client, self.agent, self.before, self.status, self.what = client, agent, before, status, what
        self.stopped = threading.Event()
        self.session_id: str | None = None
        self.after = -1

    def run(self) -> None:
        while not self.stopped.wait(POLL_SECONDS):
            # Progress is a nicety: the creating request itself reports what goes wrong.
            with contextlib.suppress(Exception):
                self._poll()

    def _poll(self) -> None:
        if self.session_id is None:
            new = _starting(self.client, self.agent) - self.before
            if len(new) != 1:
                return  # not created yet, or another client's session starts too: no guessing
            self.session_id = new.pop()
        page: dict[str, Any] = self.client.call("GET", f"/api/sessions/{self.session_id}/logs",
                                                params={"after": self.after, "limit": 1000})
        lines = page["logs"]
        if lines:
            self.after = int(lines[-1]["index"])
            self.status.update(f"{self.what} [dim]· {escape(_short(str(lines[-1].get('text', ''))))}[/dim]")


@contextmanager
def setup_progress(client: Remote, agent: str, what: str, session_id: str | None = None) -> Iterator[None]:
    """A spinner on stderr with the newest line of the session's logs while the block creates a
    session of `agent` (or resumes `session_id`, whose new sandbox may run the setup again); nothing
    when stderr is not a terminal."""
    if not errors.is_terminal:
        yield
        return
    before: set[str] = set()
    after = -1
    with contextlib.suppress(Exception):  # the request itself says what is wrong
        if session_id is None:
            before = _starting(client, agent)
        else:
            after = _newest_index(client, session_id)  # only what comes from now on
    with errors.status(what, spinner="dots") as status:
        watcher = _Watcher(client, agent, before, status, what)
        watcher.session_id, watcher.after = session_id, after
        watcher.start()
        try:
            yield
        finally:
            watcher.stopped.set()
            watcher.join(timeout=5)
