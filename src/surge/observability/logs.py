"""Each surge process's logging: TEXT or JSON lines, rotating files, sampled access logs.

`configure_logging` replaces the root handlers of a process (stderr, plus a
size-limited `RotatingFileHandler` in `logs_dir` when set) with one formatter: Ray's
TEXT layout or one JSON object per line. Every record gets the request id of the
request being served (a context variable the replica sets per request; access lines
carry theirs explicitly), so a user's `logging` calls inside a request are tied to it.

`AccessLog` writes one line per finished request, but decides first, in O(1) and
without building the line: every Nth request (`access_log_sample_rate`) and at most
`access_log_max_per_s` lines per second. Lines carry method, path (never the query
string), status, latency and ids; never bodies or headers (so no Authorization).
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
import os
import re
import sys
from typing import Any

from surge.observability.config import LoggingConfig

__all__ = ["ACCESS_LOGGER", "AccessLog", "JsonFormatter", "configure_logging", "request_id_var"]

ACCESS_LOGGER = "surge.access"
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("surge_request_id",
                                                                     default="")
# Fields an access line carries besides the message (record attributes, via `extra`).
ACCESS_FIELDS = ("method", "route", "path", "status_code", "latency_ms", "application",
                 "deployment", "replica", "client")


class _Context(logging.Filter):
    """Stamps every record with the process's component and the current request id."""

    def __init__(self, component: str, component_id: str) -> None:
        super().__init__()
        self.component, self.component_id = component, component_id

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = request_id_var.get()
        record.component_name = self.component
        record.component_id = self.component_id
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with Ray's keys where Ray has them."""

    def __init__(self, additional_attrs: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.additional_attrs = additional_attrs

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "name": record.name,
            "message": record.getMessage(),
            "component_name": getattr(record, "component_name", ""),
            "component_id": getattr(record, "component_id", ""),
        }
        request_id = getattr(record, "request_id", "")
        if request_id:
            data["request_id"] = request_id
        for name in ACCESS_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        for name in self.additional_attrs:
            data[name] = getattr(record, name, None)
        if record.exc_info:
            data["exc_text"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exc_text"] = record.exc_text
        return json.dumps(data, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", "")
        if request_id:
            first, newline, rest = text.partition("\n")
            text = f"{first} request_id={request_id}{newline}{rest}"
        return text


def _file_name(component: str, component_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", component_id)
    return f"{component}_{safe}.log" if safe else f"{component}.log"


def configure_logging(component: str, component_id: str = "",
                      config: LoggingConfig | None = None) -> LoggingConfig:
    """Set up this process's logging from `config` (its spec's; default: the defaults)."""
    config = config or LoggingConfig()
    label = f"{component} {component_id}".strip()
    formatter: logging.Formatter
    if config.encoding == "JSON":
        formatter = JsonFormatter(config.additional_log_standard_attrs)
    else:
        formatter = _TextFormatter(f"%(asctime)s %(levelname)s {label} %(name)s: %(message)s")
    context = _Context(component, component_id)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    unwritable = ""
    if config.logs_dir:
        try:
            os.makedirs(config.logs_dir, exist_ok=True)
            path = os.path.join(config.logs_dir, _file_name(component, component_id))
            handlers.append(logging.handlers.RotatingFileHandler(
                path, maxBytes=config.max_bytes, backupCount=config.backup_count,
                encoding="utf-8"))
        except OSError as exc:  # a log directory must not keep a process from serving
            unwritable = f"cannot write logs to {config.logs_dir} ({exc}); stderr only"
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(context)
        root.addHandler(handler)
    root.setLevel(config.level)
    # Access lines are INFO: written when enable_access_log is set and log_level lets
    # INFO through, as in Ray.
    logging.getLogger(ACCESS_LOGGER).setLevel(
        logging.NOTSET if config.enable_access_log else logging.WARNING)
    if unwritable:
        logging.getLogger("surge").warning("%s", unwritable)
    return config


class AccessLog:
    """Whether to write a finished request's line (cheap), and writing it."""

    __slots__ = ("_left", "_second", "_seen", "component_id", "enabled", "every", "logger",
                 "max_per_s")

    def __init__(self, config: LoggingConfig, component_id: str = "") -> None:
        rate = config.access_log_sample_rate
        self.logger = logging.getLogger(ACCESS_LOGGER)
        # Decided once (after configure_logging): off costs one attribute test per request.
        self.enabled = (config.enable_access_log and rate > 0
                        and self.logger.isEnabledFor(logging.INFO))
        self.every = max(1, round(1 / rate)) if rate > 0 else 0
        self.max_per_s = config.access_log_max_per_s
        self.component_id = component_id
        self._seen = 0
        self._second = -1
        self._left = 0

    def __repr__(self) -> str:
        return (f"<AccessLog enabled={self.enabled} every={self.every} "
                f"max_per_s={self.max_per_s}>")

    def wanted(self, now: float) -> bool:
        """Sample this request? `now` is any clock in seconds (the event loop's)."""
        if not self.enabled:
            return False
        self._seen += 1
        if self.every > 1 and self._seen % self.every:
            return False
        if self.max_per_s:
            second = int(now)
            if second != self._second:
                self._second, self._left = second, self.max_per_s
            if self._left <= 0:
                return False
            self._left -= 1
        return True

    def write(self, request_id: str, method: str, path: str, status: int, latency_ms: float,
              **fields: Any) -> None:
        extra = {"request_id": request_id, "method": method, "path": path,
                 "status_code": status, "latency_ms": round(latency_ms, 3), **fields}
        self.logger.info("%s %s %d %.2fms", method, path, status, latency_ms, extra=extra)
