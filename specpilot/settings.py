"""Settings of the distributed mode, from the environment (what `specpilot stack up` sets for the
processes it starts; any deployment tool can set the same):

  SPECPILOT_REDIS_URL    the broker and result store of the queues (redis://127.0.0.1:6379/0)
  SPECPILOT_DB_URL       the controller's round records (default: SQLite under SPECPILOT_DATA)
  SPECPILOT_MEMORY_API   the memory API's base URL (http://127.0.0.1:8710)
  SPECPILOT_GPU_WORKERS  the gRPC GPU workers, host:port,host:port,...
  SPECPILOT_DATA         where run folders (verdicts, reports) go (./specpilot-data)
  SPECPILOT_REPO         the engine's git repository (patched systems, reproduce checks)
  SPECPILOT_TOKEN        the bearer token of the controller's mutating routes
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    db_url: str | None = None
    memory_url: str = "http://127.0.0.1:8710"
    workers: tuple[str, ...] = ()
    data_dir: Path = Path("specpilot-data")
    repo: Path | None = None
    token: str | None = None

    @property
    def records_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir / 'rounds.db').resolve()}"

    @classmethod
    def from_env(cls, env=None) -> Settings:
        env = os.environ if env is None else env
        d = cls()
        return cls(redis_url=env.get("SPECPILOT_REDIS_URL", d.redis_url), db_url=env.get("SPECPILOT_DB_URL") or None,
                   memory_url=env.get("SPECPILOT_MEMORY_API", d.memory_url).rstrip("/"),
                   workers=tuple(a.strip() for a in env.get("SPECPILOT_GPU_WORKERS", "").split(",") if a.strip()),
                   data_dir=Path(env.get("SPECPILOT_DATA", str(d.data_dir))),
                   repo=Path(env["SPECPILOT_REPO"]) if env.get("SPECPILOT_REPO") else None,
                   token=env.get("SPECPILOT_TOKEN") or None)

    def env(self) -> dict[str, str]:
        """These settings as the environment of a process to start."""
        out = {"SPECPILOT_REDIS_URL": self.redis_url, "SPECPILOT_MEMORY_API": self.memory_url,
               "SPECPILOT_GPU_WORKERS": ",".join(self.workers), "SPECPILOT_DATA": str(self.data_dir)}
        for k, v in (("SPECPILOT_DB_URL", self.db_url), ("SPECPILOT_REPO", self.repo), ("SPECPILOT_TOKEN", self.token)):
            if v:
                out[k] = str(v)
        return out
