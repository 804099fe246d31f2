"""What cannot travel to a replica fails where it is written, as in Ray Serve 2.60 (its
test_deploy_2 test_nonserializable_deployment and test_deployment_error_handling):
a thread lock captured by a deployment or passed to its constructor, and a deployment
whose runtime_env would upload a local directory."""

from __future__ import annotations

import pickle
import threading

import pytest
from fastapi import APIRouter, FastAPI

from surge import serve
from surge.api.deployment import build_app_spec
from surge.config import runtime_env_uploads
from surge.errors import DeployFailedError

LOCK = threading.Lock()


@serve.deployment
class UsesTheModulesLock:
    def hello(self) -> object:
        return LOCK


def test_a_deployment_that_captures_a_lock_is_refused_when_decorated() -> None:
    class Model:
        def hello(self) -> object:
            return LOCK

    with pytest.raises(TypeError, match=r"(?s)Could not serialize the deployment .*Model"
                       r".*cannot pickle '_thread.lock'.*Variable Model\.hello -> LOCK "
                       r"\(_thread\.lock\) was found to be non-serializable"):
        serve.deployment(Model)


def test_a_class_in_an_importable_module_travels_by_import_path() -> None:
    spec = build_app_spec(UsesTheModulesLock.bind(), "app", "/")
    target = pickle.loads(spec.deployments[0].target_blob)
    assert (target.module, target.qualname) == (__name__, "UsesTheModulesLock")


def test_a_lock_among_the_constructor_arguments_is_refused_by_serve_run() -> None:
    @serve.deployment
    class Holder:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.args = args

    with pytest.raises(TypeError, match=r"init args: cannot pickle .*\n"
                       r"Variable \[1\] \(_thread\.lock\)"):
        build_app_spec(Holder.bind(1, LOCK), "app", "/")
    with pytest.raises(TypeError, match=r"init kwargs: cannot pickle .*\n"
                       r"Variable \['arg'\] -> \['inner'\] \(_thread\.lock\)"):
        build_app_spec(Holder.bind(arg={"inner": LOCK}), "app", "/")


def test_an_ingress_apps_locks_still_travel_fresh() -> None:
    router = APIRouter(prefix="/v1")  # FastAPI keeps a lock per included router
    app = FastAPI()
    app.include_router(router)

    @serve.deployment
    @serve.ingress(app)
    class Ingress:
        def __init__(self, lock: object) -> None:
            self.lock = lock

    spec = build_app_spec(Ingress.bind(LOCK), "app", "/")
    (args, _kwargs), = [pickle.loads(d.init_blob) for d in spec.deployments]
    assert type(args[0]) is type(LOCK) and args[0] is not LOCK


def test_a_deployment_runtime_env_with_a_local_directory_fails_to_deploy() -> None:
    @serve.deployment
    def f() -> None:
        return None

    local = f.options(ray_actor_options={"runtime_env": {"working_dir": "."}})
    with pytest.raises(RuntimeError, match=r"Deploying application 'default' failed: "
                       r"deployment 'f': runtime_env\.working_dir '\.' is not a URI"):
        build_app_spec(local.bind(), "default", "/")
    remote = f.options(ray_actor_options={"runtime_env": {"working_dir": "s3://b/d.zip"}})
    assert build_app_spec(remote.bind(), "default", "/").ingress == "f"
    assert issubclass(DeployFailedError, RuntimeError)


@pytest.mark.parametrize(("runtime_env", "uploads"), [
    (None, ()),
    ({"env_vars": {"A": "1"}}, ()),
    ({"working_dir": "gs://b/d.zip", "py_modules": ["https://x/m.whl"]}, ()),
    ({"working_dir": "/home/me/app"}, ("runtime_env.working_dir '/home/me/app' is not a URI",)),
    ({"py_modules": ["s3://b/m.zip", "mod"]}, ("runtime_env.py_modules 'mod' is not a URI",)),
])
def test_runtime_env_uploads(runtime_env: object, uploads: tuple[str, ...]) -> None:
    assert runtime_env_uploads({"runtime_env": runtime_env}) == uploads
