"""Protocol codecs, sans I/O: bytes in, events out, bytes to write back.

HTTP/2 (`h2.py` receiving, `h2_send.py` sending, `h2_frames.py` the frames' vocabulary,
`h2_fields.py` what a well-formed request's header list is), HPACK (`hpack.py`,
`huffman.py`), gRPC's framing on HTTP/2 (`grpc_wire.py`: a call's head, messages and
trailers) and WebSocket frames (`websocket.py`). A codec knows a protocol and nothing of
what a request means: no routing, no routers, no sockets, no event loop, no logging (an
error is raised or returned, the caller decides). The ingress adapters above
(`proxy/`) decide with what the codecs read; tests/test_layout.py keeps the layers.
"""
