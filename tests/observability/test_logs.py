"""Logging: config validation, access-log sampling, JSON lines with request ids, files."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from surge.errors import ConfigError
from surge.launch import ReplicaProcessSpec, Unix, decode, encode
from surge.observability.config import LEVEL_ENV, DashboardOptions, LoggingConfig
from surge.observability.logs import (
    AccessLog,
    JsonFormatter,
    _Context,
    configure_logging,
    request_id_var,
)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    access = logging.getLogger("surge.access").level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("surge.access").setLevel(access)


def test_logging_config_takes_rays_keys_and_checks_them() -> None:
    config = LoggingConfig.from_any({"encoding": "json", "log_level": "debug",
                                     "logs_dir": "/tmp/x", "enable_access_log": False,
                                     "additional_log_standard_attrs": ["lineno"]})
    assert config.encoding == "JSON" and config.log_level == "DEBUG"
    assert config.additional_log_standard_attrs == ("lineno",)
    for bad in ({"encoding": "XML"}, {"log_level": "LOUD"}, {"access_log_sample_rate": 2},
                {"max_bytes": 10}, {"enable_access_log": "yes"}, {"log_dir": "/tmp"}):
        with pytest.raises(ConfigError):
            LoggingConfig.from_any(bad)


def test_the_config_travels_in_the_spec_with_its_level_fixed_by_the_starter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEVEL_ENV, "debug")
    config = LoggingConfig(encoding="JSON", access_log_max_per_s=3).resolved()
    assert config.log_level == "DEBUG"  # the starting process's SURGE_LOG_LEVEL, once
    monkeypatch.delenv(LEVEL_ENV)
    spec = ReplicaProcessSpec(controller="127.0.0.1:1", process_id="Model-1", app="a",
                              deployment="Model", listen=Unix("/tmp"), logging=config)
    received = decode(ReplicaProcessSpec, encode(spec))
    assert received.logging == config and received.logging.level == "DEBUG"
    assert LoggingConfig(log_level="warning").resolved().log_level == "WARNING"


@pytest.mark.parametrize(("text", "expected"), [
    ("off", DashboardOptions(enabled=False)), (":0", DashboardOptions(port=0)),
    ("9000", DashboardOptions(port=9000)),
    ("0.0.0.0:81", DashboardOptions(host="0.0.0.0", port=81))])
def test_dashboard_addresses(text: str, expected: DashboardOptions) -> None:
    assert DashboardOptions.parse(text) == expected


def test_bad_dashboard_addresses_say_what_to_write() -> None:
    with pytest.raises(ConfigError, match="host:port"):
        DashboardOptions.parse("localhost:http")
    with pytest.raises(ConfigError,
                       match=r"dashboard port must be an integer in \[0, 65535\], got 70000\."):
        DashboardOptions.parse(":70000")


@pytest.mark.usefixtures("restore_logging")
def test_access_log_samples_every_nth_and_caps_each_second() -> None:
    logging.getLogger("surge.access").setLevel(logging.INFO)
    every_third = AccessLog(LoggingConfig(access_log_sample_rate=1 / 3,
                                          access_log_max_per_s=0))
    assert [every_third.wanted(0.0) for _ in range(6)] == [False, False, True] * 2
    capped = AccessLog(LoggingConfig(access_log_max_per_s=2))
    assert [capped.wanted(10.2) for _ in range(4)] == [True, True, False, False]
    assert capped.wanted(11.0)  # a new second, a new budget
    off = AccessLog(LoggingConfig(enable_access_log=False))
    assert not off.enabled and not off.wanted(0.0)
    assert not AccessLog(LoggingConfig(access_log_sample_rate=0)).enabled
    logging.getLogger("surge.access").setLevel(logging.WARNING)  # log_level above INFO
    assert not AccessLog(LoggingConfig()).enabled


def test_json_lines_carry_the_request_id_of_the_context_and_tracebacks() -> None:
    formatter = JsonFormatter(("lineno",))
    record = logging.LogRecord("user", logging.ERROR, __file__, 7, "failed %s", ("x",), None)
    token = request_id_var.set("req-42")
    try:  # handlers stamp each record with the context's request id
        _Context("replica", "app:r1").filter(record)
    finally:
        request_id_var.reset(token)
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    data = json.loads(formatter.format(record))
    assert data["request_id"] == "req-42" and data["message"] == "failed x"
    assert data["component_name"] == "replica" and data["component_id"] == "app:r1"
    assert data["lineno"] == 7 and "ValueError: boom" in data["exc_text"]


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_writes_rotating_files(tmp_path: Path) -> None:
    config = LoggingConfig(encoding="JSON", logs_dir=str(tmp_path), max_bytes=2048,
                           backup_count=2)
    configure_logging("replica", "app:Model-1", config)
    access = AccessLog(config)
    for index in range(100):
        access.write(f"r{index}", "GET", "/p", 200, 0.5, application="app")
    for handler in logging.getLogger().handlers:
        handler.flush()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["replica_app_Model-1.log", "replica_app_Model-1.log.1",
                     "replica_app_Model-1.log.2"]  # rotated, bounded at 3 files
    line = json.loads((tmp_path / "replica_app_Model-1.log").read_text().splitlines()[-1])
    assert line["name"] == "surge.access" and line["request_id"] == "r99"
    assert line["status_code"] == 200 and line["application"] == "app"


@pytest.mark.usefixtures("restore_logging")
def test_text_lines_end_with_the_request_id(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("proxy", "proxy-0", LoggingConfig(enable_access_log=False))
    assert logging.getLogger("surge.access").level == logging.WARNING
    token = request_id_var.set("abc-1")
    try:
        logging.getLogger("surge.test").warning("hello")
    finally:
        request_id_var.reset(token)
    err = capsys.readouterr().err
    assert "WARNING proxy proxy-0 surge.test: hello request_id=abc-1" in err
