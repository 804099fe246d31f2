"""Suite-wide settings: Hypothesis explores randomly on a developer's machine, and
replays a fixed set of examples in CI (CI=true) so a run's outcome does not depend on
the draw. Every instance the tests start puts its dashboard on a free port."""

from __future__ import annotations

import os

from hypothesis import settings

os.environ.setdefault("SURGE_DASHBOARD", "127.0.0.1:0")

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
