"""Suite-wide settings: Hypothesis explores randomly on a developer's machine, and
replays a fixed set of examples in CI (CI=true) so a run's outcome does not depend on
the draw. Every instance the tests start puts its dashboard on a free port. Ctrl-C is
Python's default in the suite even when it was started as a background job of a
shell without job control (`(make test &)`, `nohup ... &`), which ignores SIGINT: an
ignored signal is inherited across exec, so the drivers the tests stop with SIGINT
would ignore it too and never shut down. The tiers (which tests are fast, and the
check that keeps them so) are tests/tiers.py."""

from __future__ import annotations

import os
import signal

from hypothesis import settings

pytest_plugins = ["tests.tiers"]

os.environ.setdefault("SURGE_DASHBOARD", "127.0.0.1:0")
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # children: SIG_DFL

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
