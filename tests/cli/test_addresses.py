"""Which instance `surge deploy/status/config/shutdown` talk to without `-a`: as Ray's
`serve` CLI, the dashboard at RAY_DASHBOARD_ADDRESS when set (surge's own SURGE_ADDRESS,
when set, still wins). Nothing answers at the addresses used here: the error names
the address the command tried."""

from __future__ import annotations

import socket

import pytest

from surge.cli.main import main


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("command", [["status"], ["config"], ["shutdown", "-y"]])
def test_ray_dashboard_address_is_where_the_command_goes(
        command: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    monkeypatch.delenv("SURGE_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_DASHBOARD_ADDRESS", f"127.0.0.1:{port}")  # no scheme: HTTP
    main(command)  # 1, or 0 for shutdown ("nothing to shut down")
    assert f"no surge dashboard answers at http://127.0.0.1:{port}" in capsys.readouterr().err


def test_surge_address_wins_over_ray_dashboard_address(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SURGE_ADDRESS", f"127.0.0.1:{closed_port()}")
    monkeypatch.setenv("RAY_DASHBOARD_ADDRESS", f"http://127.0.0.1:{closed_port()}")
    assert main(["status"]) == 1
    assert "no surge dashboard answers" not in capsys.readouterr().err
