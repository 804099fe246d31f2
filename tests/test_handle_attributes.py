"""The attributes Ray 2.60's `DeploymentHandle` keeps for itself, which a handle must not
turn into deployment methods: `handle_id` (as Ray's), `init_options` and
`request_counter` (surge's recorded difference: docs/ray-compat.md). No instance needed:
a handle only reaches its router when called."""

from __future__ import annotations

import pickle

import pytest

from surge.router.handle import DeploymentHandle


def test_handle_id_is_shared_by_the_handles_made_from_a_handle() -> None:
    handle = DeploymentHandle("Model", "app")
    assert isinstance(handle.handle_id, str) and handle.handle_id.isalnum()
    assert len(handle.handle_id) == 8  # Ray's get_random_string()
    assert handle.options(stream=True).handle_id == handle.handle_id
    assert handle.predict.handle_id == handle.handle_id
    assert DeploymentHandle("Model", "app").handle_id != handle.handle_id


def test_a_handle_rebuilt_from_a_pickle_has_its_own_handle_id() -> None:
    """Ray's __reduce__ carries the name, app and options, not the id."""
    handle = DeploymentHandle("Model", "app").predict
    copy = pickle.loads(pickle.dumps(handle))
    assert copy.handle_options == handle.handle_options
    assert copy.handle_id != handle.handle_id


def test_init_options_and_request_counter_are_not_deployment_methods() -> None:
    handle = DeploymentHandle("Model", "app")
    assert handle.init_options is None
    with pytest.raises(AttributeError, match="request_counter"):
        handle.request_counter  # noqa: B018 - the attribute access is the test
    assert not hasattr(handle, "request_counter")
    # A method of that name is still callable, as on Ray, through options().
    assert handle.options(method_name="request_counter").handle_options.method_name == \
        "request_counter"
