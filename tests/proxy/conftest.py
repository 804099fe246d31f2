"""Every test here fails if an exchange dropped a frame its table refused (a bug that
Exchange.deliver logs rather than raising into the router)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_dropped_frames(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.ERROR, logger="surge.proxy")
    yield
    dropped = [r.getMessage() for r in caplog.records
               if r.name == "surge.proxy" and r.getMessage().startswith("dropped")]
    assert dropped == [], dropped
