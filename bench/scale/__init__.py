"""The pieces of bench/control_scale.py: the real controller against fake members.

`controller_main.py` is the controller's entry point (surge.controller.main) with a
backend whose replicas live in `replica_host.py` processes; `router_host.py` processes
hold the routers. Every member speaks surge's real control protocol over real sockets.
"""
