"""What every protocol front end of one runtime server shares: config, root, processes, health."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from .activity import Activity
from .claimenv import ClaimEnv
from .config import RuntimeConfig
from .paths import confine, names_root, real_root
from .processes import Supervisor

__all__ = ["SENSITIVE_ENV_MARKERS", "RuntimeState"]

# /v1/metadata never serves a variable whose name contains one of these (case-insensitive), spec §2.2.
SENSITIVE_ENV_MARKERS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CRED",
    "KEY",
    "AUTH",
    "BEARER",
    "PRIVATE",
    "CERT",
)


class RuntimeState:
    """Shared by the legacy app, the REST app and the gRPC service of one server."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.configured_root = config.client_root or os.path.abspath(os.fspath(config.root_dir))
        self.root = real_root(config.root_dir)
        env = dict(os.environ if config.command_env is None else config.command_env)
        self.activity = Activity()
        self.claim_env = (
            ClaimEnv(config.claim_env_file, config.claim_env_wait) if config.claim_env_file else None
        )
        self.supervisor = Supervisor(
            max_processes=config.max_processes,
            chunk_size=config.stream_chunk_size,
            env=env,
            claim_env=self.claim_env,
            on_activity=self.activity.touch,
            drain_after_exit=config.output_drain_after_exit,
            quiet_after_exit=config.output_quiet_after_exit,
        )
        self.started = time.monotonic()
        self.draining = False
        self._metadata: dict[str, str] | None = None

    def resolve(self, user_path: str) -> str:
        """Legacy rule: the path relative to the root (PathEscape / InvalidPath)."""
        return confine(self.root, user_path)

    def resolve_sandboxd(self, user_path: str) -> str:
        """sandboxd rule: like `resolve`, and a path spelled with the configured root has it stripped."""
        return confine(self.root, user_path, configured_root=self.configured_root)

    def names_root(self, user_path: str, *, sandboxd: bool) -> bool:
        """Whether `user_path` spells the root itself (no symlink followed), by the legacy or sandboxd rule."""
        return names_root(self.root, user_path, configured_root=self.configured_root if sandboxd else None)

    def metadata(self) -> dict[str, str]:
        """The prefixed, non-secret environment, snapshotted at the first call."""
        if self._metadata is None:
            prefix = self.config.metadata_env_prefix
            source: Mapping[str, str] = self.supervisor.environment(None)
            self._metadata = {
                k: v
                for k, v in source.items()
                if k.startswith(prefix) and not any(m in k.upper() for m in SENSITIVE_ENV_MARKERS)
            }
        return self._metadata
