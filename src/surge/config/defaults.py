"""Every default of surge's configs, each a named constant with the reason for its value."""

from __future__ import annotations

# Ray Serve's default since 2.32: small enough that routers spread load early.
DEFAULT_MAX_ONGOING_REQUESTS = 5
# -1 means "no explicit limit", as in Ray Serve; surge still caps it (QUEUE_SAFETY_LIMIT).
DEFAULT_MAX_QUEUED_REQUESTS = -1
# Requests one router may hold waiting for a replica when no limit is set: bounds memory
# (a queued HTTP request costs ~1-2 KiB) while absorbing a burst of ~1 s at 10k/s.
QUEUE_SAFETY_LIMIT = 10_000
# With max_queued_requests unset, a request that would wait longer than this for a
# replica is refused at once (503 + Retry-After) instead of queued: past ~100 ms of
# queueing, interactive clients and latency SLOs are lost anyway, and a refusal lets the
# client retry on the capacity the autoscaler is adding (surge-only; None: count only).
DEFAULT_MAX_QUEUE_WAIT_S = 0.1
# Replicas run this much nicer than the proxy and the controller (CPU priority, Linux
# nice) where the node's replicas can keep all its cores busy (policy/threads.replica_nice):
# on a node whose cores the replicas saturate, the proxy still gets the CPU to refuse the
# excess in milliseconds and the controller to hear and decide. (Measured: 32 CPU-bound
# replicas on 2 cores left the proxy so little CPU that 503s took 189 ms and clients timed
# out by thousands.) Below that it only delays the replicas' wake-ups behind the proxy's.
REPLICA_NICE = 10
# Ray Serve's health-check cadence and patience.
DEFAULT_HEALTH_CHECK_PERIOD_S = 10.0
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 30.0
# Constructor failures in a row, with no replica running, before a deploy fails. Ray
# retries 20 times; each retry here costs a process start, so fail fast and say why.
DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT = 3
# Ray Serve's drain budget before a replica is killed.
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2.0
# Ray Serve's HTTP defaults; loopback so nothing is exposed by accident.
DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
# Bodies above this are refused with 413 before they are buffered.
DEFAULT_MAX_BODY_BYTES = 100 * 1024 * 1024
# Request line + headers above this are refused with 431 (nginx allows 4 x 8 KiB).
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
# A request whose headers take longer than this to arrive (slowloris) gets 408.
DEFAULT_REQUEST_HEADER_TIMEOUT_S = 30.0
# A request body that stops arriving for this long gets 408 (nginx's client_body_timeout,
# also a silence between reads, is 60 s); without it a truncated body held its
# connection forever.
DEFAULT_REQUEST_BODY_TIMEOUT_S = 30.0
# A WebSocket message from a client above this closes the socket with 1009 (uvicorn's
# ws_max_size, which Ray Serve's proxy runs with).
DEFAULT_WEBSOCKET_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# A WebSocket with no message, ping or pong either way for this long is closed with 1001:
# a socket whose peer vanished without a FIN holds a replica slot until then.
DEFAULT_WEBSOCKET_IDLE_TIMEOUT_S = 600.0
# Open client connections per proxy worker; more are answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 10_000
# Ray/uvicorn's keep-alive; long enough for load balancers that reuse connections.
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 90.0
# The control API of a running instance (loopback). SURGE_ADDRESS overrides it.
DEFAULT_CONTROL_PORT = 52800
# "auto" in Ray Serve means autoscaling between 1 and 100 replicas.
AUTO_MAX_REPLICAS = 100

# Client-certificate modes, in the order of ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED.
CERT_REQS = ("none", "optional", "required")
