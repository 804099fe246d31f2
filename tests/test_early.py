"""surge.backends.early: what a controller starts before its imports, and who takes it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from surge.backends import early
from surge.backends.early import FORKSERVER, PROXY, early_kinds
from surge.config import HTTPOptions
from surge.launch import ControllerProcessSpec, encode


def _line(**fields: object) -> bytes:
    return encode(ControllerProcessSpec(address="127.0.0.1:0", **fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(("line", "kinds"), [
    (_line(), (FORKSERVER, PROXY)),
    (_line(http=HTTPOptions(location="HeadOnly")), (FORKSERVER, PROXY)),
    (_line(http=HTTPOptions(location="Disabled")), (FORKSERVER,)),
    (_line(http=HTTPOptions(location="NoServer")), (FORKSERVER,)),
    (_line(recover=True), (FORKSERVER,)),  # a restart re-attaches to the running proxies
    (_line(backend="ray"), ()),
    (b"not json\n", ()),
    (b"[1, 2]\n", ()),
])
def test_what_starts_early(line: bytes, kinds: tuple[str, ...]) -> None:
    assert early_kinds(line) == kinds


@pytest.mark.e2e  # starts a process (tests/tiers.py)
def test_an_early_proxy_is_taken_once_with_its_environment_and_the_rest_are_stopped(
        ) -> None:
    early.start_early(_line())
    try:
        env = early.forkserver_env()
        wrong = dict(env, SOMETHING_ELSE="1")
        forkserver = early._early[FORKSERVER][1]
        proxy = early.take_early(PROXY, env)
        assert proxy is not None and proxy.poll() is None
        assert early.take_early(PROXY, env) is None  # once
        assert early.take_early(FORKSERVER, wrong) is None  # not with another environment
        assert forkserver.poll() is not None  # ... which stopped it
        early._stop(proxy)
        early.start_early(_line(http=HTTPOptions(location="Disabled")))
        untaken = early._early[FORKSERVER][1]
        early.stop_untaken()
        assert untaken.poll() is not None and not early._early
    finally:
        early.stop_untaken()


@pytest.mark.e2e  # starts a process (tests/tiers.py)
def test_an_early_proxy_that_never_gets_a_spec_exits_quietly() -> None:
    """Its controller died first: EOF on stdin. A proxy started by hand says why."""
    quiet = subprocess.run([sys.executable, "-m", "surge.proxy", "early"], input=b"",
                           capture_output=True, timeout=60)
    assert (quiet.returncode, quiet.stderr) == (0, b"")
    by_hand = subprocess.run([sys.executable, "-m", "surge.proxy"], input=b"",
                             capture_output=True, timeout=60)
    assert by_hand.returncode == 2
    assert b"reads its ProxyProcessSpec on standard input" in by_hand.stderr
