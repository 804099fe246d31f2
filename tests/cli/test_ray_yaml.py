"""`surge status` / `surge config` documents, as Ray 2.60's CLI prints them.

The expected texts are what Ray's own dumper (ray.serve.scripts' ServeDeploySchemaDumper,
after its process_dict_for_yaml_dump) writes for the same documents;
tests/e2e/test_ray_cli.py compares the two CLIs on a live instance.
"""

from __future__ import annotations

from surge.cli.ray_yaml import dump, serve_status

DETAILS = {
    "controller_info": {"node_id": "n1"},
    "proxies": {"proxy-0": {"node_id": "n1", "status": "HEALTHY"}},
    "applications": {"bad": {
        "name": "bad", "route_prefix": "/bad", "status": "DEPLOY_FAILED",
        "message": "deployment 'A' failed to start:\n\x1b[31mZeroDivisionError\x1b[39m",
        "last_deployed_time_s": 1700000000.5, "deployed_app_config": None,
        "deployments": {"A": {
            "name": "A", "status": "DEPLOY_FAILED", "status_trigger": "REPLICA_STARTUP_FAILED",
            "message": "boom", "target_num_replicas": 2,
            "replicas": [{"replica_id": "r1", "state": "STOPPING"},
                         {"replica_id": "r2", "state": "STOPPING"},
                         {"replica_id": "r3", "state": "STARTING"}]}}}},
    "target_capacity": None,
}

RAY_STATUS = """\
proxies:
  proxy-0: HEALTHY

applications:
  bad:
    status: DEPLOY_FAILED
    message: |-
      deployment 'A' failed to start:
      ZeroDivisionError
    last_deployed_time_s: 1700000000.5
    deployments:
      A:
        status: DEPLOY_FAILED
        status_trigger: REPLICA_STARTUP_FAILED
        replica_states:
          STOPPING: 2
          STARTING: 1
        message: boom

target_capacity: null
"""


def test_status_is_rays_serve_status_document() -> None:
    assert dump(serve_status(DETAILS)) == RAY_STATUS


def test_nothing_running_is_rays_empty_status() -> None:
    empty = {"controller_info": {}, "proxies": {}, "applications": {},
             "target_capacity": None}
    assert dump(serve_status(empty)) == "proxies: {}\n\napplications: {}\n\ntarget_capacity: null\n"


def test_a_config_has_a_blank_line_between_its_top_level_keys() -> None:
    config = {"name": "app1", "route_prefix": "/", "import_path": "main:app",
              "args": {"message": "hi"}}
    assert dump(config) == ("name: app1\n\nroute_prefix: /\n\nimport_path: main:app\n\n"
                            "args:\n  message: hi\n")
