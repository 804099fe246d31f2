"""Async shell around policy.routing and policy.admission, shared by proxies and handles."""
