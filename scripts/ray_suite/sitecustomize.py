"""Every process of a scripts/ray_suite run: `ray.serve` is surge's (surge_as_ray.alias);
on the anchor, Ray's own, with `ray.serve.tests` read from the given test files (a replica
unpickles a test's helper deployment, such as test_config_files.grpc_deployment, by name)."""

import os

if os.environ.get("SURGE_AS_RAY") == "1":
    import surge_as_ray

    surge_as_ray.alias()
elif os.environ.get("SURGE_AS_RAY_ANCHOR") == "1":
    import surge_as_ray

    surge_as_ray._tests_package()
