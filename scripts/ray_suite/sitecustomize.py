"""Every process of a scripts/ray_suite run: `ray.serve` is surge's (surge_as_ray.alias)."""

import os

if os.environ.get("SURGE_AS_RAY") == "1":
    import surge_as_ray

    surge_as_ray.alias()
