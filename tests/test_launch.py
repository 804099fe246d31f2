"""surge.launch: every config a user can write reaches its process intact."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from surge.config import HTTPOptions
from surge.errors import ConfigError
from surge.launch import (
    ControllerProcessSpec,
    Lifetime,
    ReplicaProcessSpec,
    Tcp,
    Unix,
    decode,
    encode,
    read_spec,
    start_process,
)
from surge.observability.config import DashboardOptions, LoggingConfig


@pytest.mark.parametrize("http", [
    HTTPOptions(), HTTPOptions(max_body_bytes=1e6, request_timeout_s=3),  # type: ignore[arg-type]
    HTTPOptions(port=0, proxy_workers=2, location="HeadOnly"),
])
def test_a_controller_spec_survives_the_pipe(http: HTTPOptions) -> None:
    spec = ControllerProcessSpec(address="127.0.0.1:1", http=http, token="t", recover=True,
                                 lifetime=Lifetime(supervisor_pid=7, parent_pid=7),
                                 logging=LoggingConfig(encoding="JSON", logs_dir="/tmp/x"),
                                 dashboard=DashboardOptions(enabled=False))
    assert read_spec(ControllerProcessSpec, io.BytesIO(encode(spec))) == spec


def test_listen_addresses_are_typed() -> None:
    for listen in (Unix("/run/s"), Tcp(), Tcp("10.0.0.2", also_unix=True)):
        spec = ReplicaProcessSpec(controller="c", process_id="r", app="a", deployment="d",
                                  listen=listen)
        assert decode(ReplicaProcessSpec, encode(spec)).listen == listen


def test_a_missing_or_wrong_spec_says_what_it_is() -> None:
    with pytest.raises(ConfigError, match="started by surge, not by hand"):
        read_spec(ReplicaProcessSpec, io.BytesIO(b""))
    with pytest.raises(ConfigError, match="unreadable ReplicaProcessSpec"):
        read_spec(ReplicaProcessSpec, io.BytesIO(b'{"type": "proxy"}\n'))


@pytest.mark.e2e  # starts a process (tests/tiers.py)
def test_a_process_that_dies_before_reading_its_spec_is_no_error_to_its_starter() -> None:
    process = start_process([sys.executable, "-c", "import os; os._exit(3)"], b"x" * 300_000,
                            {}, stdout=subprocess.DEVNULL)
    assert process.wait(10) == 3


def test_weight_store_specs_survive_the_pipe() -> None:
    from surge.config.weights import WeightStoreOptions
    from surge.launch import NodeWeightStore, WeightStoreProcessSpec

    options = WeightStoreOptions(directory="/mnt/huge", budget_bytes=1 << 30)
    store = WeightStoreProcessSpec(options=options, socket_path="/run/w.sock", listen_fd=7,
                                   lifetime=Lifetime(supervisor_pid=3, parent_pid=4))
    assert read_spec(WeightStoreProcessSpec, io.BytesIO(encode(store))) == store
    for where in ("/run/w.sock", NodeWeightStore("instance-x", options), None):
        replica = ReplicaProcessSpec(controller="c", process_id="r", app="a", deployment="d",
                                     listen=Unix("/s"), weight_store=where)
        assert decode(ReplicaProcessSpec, encode(replica)) == replica
    path = NodeWeightStore("inst/ance:1").socket_path("abcdef0123456789ffff")
    assert path.endswith("/weights-inst_ance_1-abcdef0123456789.sock")
