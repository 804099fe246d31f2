"""WeightStoreOptions: serve.start(weight_store=...) in every spelling, checked."""

from __future__ import annotations

import pytest

from surge.config.weights import WeightStoreOptions
from surge.errors import ConfigError


def test_every_spelling_gives_options() -> None:
    assert WeightStoreOptions.from_any(None) == WeightStoreOptions()
    assert WeightStoreOptions.from_any(True) == WeightStoreOptions()
    assert WeightStoreOptions.from_any(False) == WeightStoreOptions(enabled=False)
    given = WeightStoreOptions(directory="/mnt/huge")
    assert WeightStoreOptions.from_any(given) is given
    assert WeightStoreOptions.from_any({"budget_bytes": 10}).budget_bytes == 10


def test_the_budget_defaults_to_half_the_filesystem() -> None:
    assert WeightStoreOptions().budget_for(1000) == 500
    assert WeightStoreOptions(budget_bytes=7).budget_for(1000) == 7


@pytest.mark.parametrize(("data", "message"), [
    ({"directory": "relative"}, "directory must be an absolute path"),
    ({"budget_bytes": 0}, "budget_bytes must be a positive integer"),
    ({"budget_bytes": True}, "budget_bytes must be a positive integer"),
    ({"enabled": "yes"}, "enabled must be true or false"),
    ({"budget": 1}, "unknown key 'budget'. Did you mean 'budget_bytes'"),
])
def test_bad_options_are_clear_errors(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WeightStoreOptions.from_any(data)
