"""The replica process: serve frames, enforce max_ongoing_requests, call user code, drain."""
