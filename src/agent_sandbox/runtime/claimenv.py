"""A claim's environment, delivered to every command of a warm-claimed sandbox (docs/lifecycle.md).

Upstream forces a cold start when a SandboxClaim carries `env` (a running Pod's spec cannot change). A
template that opts in projects the pod annotation `runtime.agents.x-k8s.io/claim-env` into a file with the
downward API; the claim controller writes the claim's env there (a JSON object) when it adopts a warm
member, the kubelet (or the dev cluster's runner) rewrites the file, and this module hands it to every
command the runtime starts. Environment order: the runtime's own, then the claim's, then a request's
per-command `env` (later wins).

File states: absent - the pod does not project it, no claim env; empty - the annotation is not on the pod
yet (a warm member before its claim, or the kubelet has not rewritten the file yet): a command waits up to
`--claim-env-wait` for it, then fails with a message saying so (never runs without the env it was promised);
a JSON object - the env; anything else - commands fail naming the file and the problem.
"""

from __future__ import annotations

import asyncio
import os
import time

from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV, decode_claim_env

__all__ = ["ClaimEnv", "ClaimEnvUnavailable"]

_POLL = 0.05


class ClaimEnvUnavailable(Exception):
    """The claim env is not (yet) usable; the message says why."""


class ClaimEnv:
    """The claim env file of one runtime server, re-read whenever it changes (one stat per command)."""

    def __init__(self, path: str, wait: float) -> None:
        self.path = path
        self.wait_limit = wait
        self._stamp: tuple[int, int, int] | None = None
        self._value: dict[str, str] | None = None
        self._error = ""

    def current(self) -> dict[str, str] | None:
        """The env now; None while not delivered (empty file).

        Raises:
            ClaimEnvUnavailable: the file holds something that is not a claim env.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise ClaimEnvUnavailable(f"cannot read claim environment {self.path}: {err.strerror}") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            self._stamp = stamp
            self._value, self._error = self._load()
        if self._error:
            raise ClaimEnvUnavailable(self._error)
        return self._value

    def _load(self) -> tuple[dict[str, str] | None, str]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except OSError as err:
            return None, f"cannot read claim environment {self.path}: {err.strerror}"
        if not raw.strip():
            return None, ""
        try:
            return decode_claim_env(raw), ""
        except ValueError as err:
            return None, f"claim environment {self.path} is not usable: {err}"

    async def wait(self) -> dict[str, str]:
        """The env, waiting up to the limit for it to be delivered.

        Raises:
            ClaimEnvUnavailable: still not delivered after the wait, or unusable.
        """
        deadline = time.monotonic() + self.wait_limit
        while True:
            env = self.current()
            if env is not None:
                return env
            if time.monotonic() >= deadline:
                raise ClaimEnvUnavailable(
                    f"the claim environment was not delivered within {self.wait_limit:g}s ({self.path} is "
                    f"empty: the pod has no {ANNOTATION_CLAIM_ENV} annotation yet; is this sandbox claimed?)"
                )
            await asyncio.sleep(_POLL)
