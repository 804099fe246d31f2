"""The driver-side implementation of Ray Serve's API (`surge.serve` re-exports it)."""
