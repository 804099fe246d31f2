"""The controller's checkpoint files and the control token's files: plain file I/O."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from surge import control_auth
from surge.config import AppSpec, DeploymentConfig, DeploymentSpec
from surge.controller.checkpoint import Checkpoint, Members, SavedApp


def app(name: str = "app") -> AppSpec:
    spec = DeploymentSpec(config=DeploymentConfig(name="D"), target_blob=b"t", init_blob=b"i")
    return AppSpec(name=name, route_prefix="/" + name, ingress="D", deployments=(spec,))


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.save_apps([SavedApp(app(), {"D": 3})])
    members = Members({"D-1": {"pid": 10, "app": "app", "deployment": "D"}}, {"proxy-0": 11})
    checkpoint.save_members(members)
    apps, loaded = Checkpoint(str(tmp_path)).load()
    assert [a.spec.name for a in apps] == ["app"] and apps[0].versions == {"D": 3}
    assert loaded == members
    for name in ("apps.pickle", "members.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupt_or_missing_checkpoint_loads_as_empty(tmp_path: Path) -> None:
    assert Checkpoint(str(tmp_path)).load() == ([], Members())
    (tmp_path / "apps.pickle").write_bytes(b"not a pickle")
    (tmp_path / "members.json").write_text("{")
    assert Checkpoint(str(tmp_path)).load() == ([], Members())


def test_checkpoint_without_directory_is_off() -> None:
    checkpoint = Checkpoint(None)
    checkpoint.save_apps([SavedApp(app(), {})])
    checkpoint.save_members(Members())
    assert checkpoint.load() == ([], Members())


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(control_auth.TOKEN_ENV, raising=False)
    return tmp_path


def test_token_is_published_privately_and_found(private_tmp: Path) -> None:
    path = control_auth.publish("127.0.0.1:5", "secret")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(control_auth.user_dir()).st_mode & 0o777 == 0o700
    assert control_auth.find_token("127.0.0.1:5") == "secret"
    assert control_auth.find_token("127.0.0.1:6") is None
    control_auth.withdraw("127.0.0.1:5", "another instance's")
    assert control_auth.find_token("127.0.0.1:5") == "secret"
    control_auth.withdraw("127.0.0.1:5", "secret")
    assert control_auth.find_token("127.0.0.1:5") is None


def test_environment_token_wins(private_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control_auth.publish("127.0.0.1:5", "from-file")
    monkeypatch.setenv(control_auth.TOKEN_ENV, "from-env")
    assert control_auth.find_token("127.0.0.1:5") == "from-env"


def test_a_directory_others_can_read_is_refused(private_tmp: Path) -> None:
    shared = private_tmp / f"surge-{os.getuid()}"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(PermissionError, match="mode 0700"):
        control_auth.user_dir()


@pytest.mark.e2e  # starts a process (tests/tiers.py)
def test_members_are_recognised_by_pid_and_start_time() -> None:
    import subprocess
    import sys

    from surge.process import start_time

    me = os.getpid()
    started = start_time(me)
    assert started is not None
    assert Members(started={me: started}).is_member(me)
    assert not Members(started={me: started + 1}).is_member(me)  # a recycled pid
    assert not Members().is_member(me)  # never saved
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_started = start_time(child.pid)
    child.wait()
    assert child_started is not None
    assert not Members(started={child.pid: child_started}).is_member(child.pid)  # gone
