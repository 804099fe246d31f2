"""surge.api.pickling: what travels by value to a replica that plain cloudpickle refuses."""

from __future__ import annotations

import pickle
import threading

import cloudpickle
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from starlette.datastructures import State

from surge.api.pickling import pickle_by_value


class Holder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rlock = threading.RLock()


def test_a_lock_travels_as_a_fresh_unlocked_lock() -> None:
    holder = Holder()
    holder.lock.acquire()
    holder.rlock.acquire()
    with pytest.raises(TypeError, match="lock"):
        cloudpickle.dumps(holder)  # what surge did before
    copy = pickle.loads(pickle_by_value(holder))
    assert type(copy.lock) is type(threading.Lock()) and not copy.lock.locked()
    assert type(copy.rlock) is type(threading.RLock())
    assert copy.rlock.acquire(blocking=False)  # free for this thread, and any other


def test_an_app_with_included_routers_travels() -> None:
    router = APIRouter(prefix="/v1")

    @router.get("/ping")
    def ping() -> str:
        return "pong"

    app = FastAPI()
    app.include_router(router)
    copy = pickle.loads(pickle_by_value(app))
    assert TestClient(copy).get("/v1/ping").json() == "pong"


def test_state_travels_by_its_contents_and_the_reducers_stay_in_surge() -> None:
    state = State({"model": "m"})
    assert pickle.loads(pickle_by_value(state)).model == "m"
    with pytest.raises(TypeError):
        pickle.dumps(threading.Lock())  # nothing was registered process-wide


@pytest.mark.e2e  # starts a process (tests/tiers.py)
def test_a_class_made_in_a_function_keeps_its_qualname_in_another_process() -> None:
    import subprocess
    import sys

    def factory() -> type:
        class Local:
            def method(self) -> None: ...
        return Local

    blob = pickle_by_value(factory())
    loaded = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; cls = pickle.loads(sys.stdin.buffer.read());"
         "print(cls.__qualname__, cls.method.__qualname__)"],
        input=blob, capture_output=True, check=True)
    prefix = "test_a_class_made_in_a_function_keeps_its_qualname_in_another_process"
    assert loaded.stdout.decode().split() == [f"{prefix}.<locals>.factory.<locals>.Local",
                                              f"{prefix}.<locals>.factory.<locals>.Local.method"]
