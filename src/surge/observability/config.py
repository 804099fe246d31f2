"""Ray Serve's `logging_config` and where the controller's web server listens.

The process that starts an instance decides both (`serve.start(logging_config=...,
dashboard_port=...)`, the YAML config, or the user's SURGE_LOG_LEVEL and
SURGE_DASHBOARD) and hands them to the controller in its spec (surge.launch), which
hands the logging config to every proxy and replica the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from surge.config import from_mapping
from surge.config.schema import number
from surge.errors import ConfigError

__all__ = [
    "DASHBOARD_ENV",
    "DEFAULT_ACCESS_LOG_MAX_PER_S",
    "DEFAULT_DASHBOARD_HOST",
    "DEFAULT_DASHBOARD_PORT",
    "DEFAULT_LOG_BACKUP_COUNT",
    "DEFAULT_LOG_MAX_BYTES",
    "LEVEL_ENV",
    "DashboardOptions",
    "LoggingConfig",
]

DASHBOARD_ENV = "SURGE_DASHBOARD"
LEVEL_ENV = "SURGE_LOG_LEVEL"

# Next to the control port (52800). Not Ray's 8265: on a Ray head that one is taken.
DEFAULT_DASHBOARD_PORT = 52801
# Loopback: the page and /metrics have no authentication.
DEFAULT_DASHBOARD_HOST = "127.0.0.1"
# Access-log lines per second per process: every request of someone trying the service
# is logged, while under load the log writes ~10 lines/s, a cost nobody can measure.
DEFAULT_ACCESS_LOG_MAX_PER_S = 10
# Rotation: 20 MiB x (1 + 5 backups) bounds each process's log files at 120 MiB.
DEFAULT_LOG_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_LOG_BACKUP_COUNT = 5
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ENCODINGS = ("TEXT", "JSON")
OFF = ("off", "none", "disabled")


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    """Ray Serve's `LoggingConfig` (encoding, log_level, logs_dir, enable_access_log,
    additional_log_standard_attrs), plus surge's access-log sampling and rotation."""

    encoding: str = "TEXT"
    log_level: str | None = None  # None: SURGE_LOG_LEVEL of the starting process, else INFO
    logs_dir: str | None = None  # None: stderr only; else also rotating files there
    enable_access_log: bool = True
    additional_log_standard_attrs: tuple[str, ...] = ()
    access_log_sample_rate: float = 1.0  # fraction of requests considered (every Nth)
    access_log_max_per_s: int = DEFAULT_ACCESS_LOG_MAX_PER_S  # 0: no limit
    max_bytes: int = DEFAULT_LOG_MAX_BYTES
    backup_count: int = DEFAULT_LOG_BACKUP_COUNT

    def __post_init__(self) -> None:
        encoding = str(self.encoding).upper()
        if encoding not in ENCODINGS:
            raise ConfigError(f"encoding must be TEXT or JSON, got {self.encoding!r}.")
        object.__setattr__(self, "encoding", encoding)
        if self.log_level is not None:
            level = str(self.log_level).upper()
            if level not in LOG_LEVELS:
                raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got "
                                  f"{self.log_level!r}.")
            object.__setattr__(self, "log_level", level)
        if self.logs_dir is not None and not isinstance(self.logs_dir, str):
            raise ConfigError(f"logs_dir must be a directory path, got {self.logs_dir!r}.")
        if not isinstance(self.enable_access_log, bool):
            raise ConfigError(f"enable_access_log must be true or false, got "
                              f"{self.enable_access_log!r}.")
        attrs = self.additional_log_standard_attrs
        if isinstance(attrs, str) or not all(isinstance(a, str) for a in attrs):
            raise ConfigError("additional_log_standard_attrs must be a list of LogRecord "
                              "attribute names, e.g. [name, lineno].")
        object.__setattr__(self, "additional_log_standard_attrs", tuple(attrs))
        number("access_log_sample_rate", self.access_log_sample_rate, ge=0, le=1)
        for name, minimum in (("access_log_max_per_s", 0), ("max_bytes", 1024),
                              ("backup_count", 0)):
            number(name, getattr(self, name), ge=minimum, integer=True)

    @property
    def level(self) -> str:
        return self.log_level or os.environ.get(LEVEL_ENV, "").upper() or "INFO"

    def resolved(self) -> LoggingConfig:
        """This config as the starting process means it (level from its environment,
        logs_dir from its working directory): the spec a child gets says it all."""
        logs_dir = os.path.abspath(self.logs_dir) if self.logs_dir else None
        return dataclasses.replace(self, log_level=self.level, logs_dir=logs_dir)

    @classmethod
    def from_any(cls, value: LoggingConfig | Mapping[str, Any] | None) -> LoggingConfig:
        if value is None:
            return cls()
        if isinstance(value, LoggingConfig):
            return value
        return from_mapping(cls, dict(value), "logging_config")


@dataclass(frozen=True, kw_only=True)
class DashboardOptions:
    """Where the controller serves /metrics and the dashboard page (port 0: any free one)."""

    host: str = DEFAULT_DASHBOARD_HOST
    port: int = DEFAULT_DASHBOARD_PORT
    enabled: bool = True
    # Asked for explicitly (serve.start(dashboard_port=...), `surge start --dashboard-*`):
    # an instance that cannot bind it does not start (the REST API must be where tools
    # look); the default address busy only turns the dashboard off, with a warning.
    required: bool = False

    def __post_init__(self) -> None:
        number("dashboard port", self.port, ge=0, le=65535, integer=True, path=("port",))

    @classmethod
    def parse(cls, text: str) -> DashboardOptions:
        """`host:port`, `:port`, `port` or `off`."""
        text = text.strip()
        if text.lower() in OFF:
            return cls(enabled=False)
        host, _, port = text.rpartition(":")
        try:
            number = int(port)
        except ValueError:
            raise ConfigError(f"{DASHBOARD_ENV} must be host:port, :port or off, got "
                              f"{text!r}.") from None
        return cls(host=host.strip("[]") or DEFAULT_DASHBOARD_HOST, port=number)

    @classmethod
    def from_env(cls) -> DashboardOptions:
        """SURGE_DASHBOARD's; a value that does not parse turns the dashboard off (with a
        warning), it does not stop an instance from starting."""
        text = os.environ.get(DASHBOARD_ENV)
        if not text:
            return cls()
        try:
            return cls.parse(text)
        except ConfigError as exc:
            logging.getLogger("surge").warning("%s; the dashboard and /metrics are off", exc)
            return cls(enabled=False)


