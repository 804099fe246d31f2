"""The control loop: desired state, replica lifecycle, health, pushes to routers."""
