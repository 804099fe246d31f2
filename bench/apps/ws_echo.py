"""A FastAPI WebSocket echo on surge or Ray Serve 2.60: `python ws_echo.py surge|ray PORT`.

Run with surge's Python for `surge`, with the Ray virtualenv's for `ray`
(bench/websocket_echo.py starts both). No `from __future__ import annotations`: Ray
2.60 then answers the handshake 403 (its copy of the class route cannot resolve
`ws: "WebSocket"`; surge resolves route annotations before pickling).
"""

import sys

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from until_sigterm import serve_until_sigterm

if sys.argv[1] == "ray":
    from ray import serve
else:
    from surge import serve  # type: ignore[no-redef]

app = FastAPI()


@serve.deployment(max_ongoing_requests=1000)
@serve.ingress(app)
class Echo:
    @app.websocket("/")
    async def echo(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    await ws.send_text(message["text"])
                else:
                    await ws.send_bytes(message["bytes"])
        except WebSocketDisconnect:
            pass


def main() -> None:
    port = int(sys.argv[2])
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Echo.bind(), name="ws", route_prefix="/ws")
    print(f"READY ws://127.0.0.1:{port}/ws/", flush=True)

    serve_until_sigterm(serve.shutdown)


if __name__ == "__main__":
    main()
