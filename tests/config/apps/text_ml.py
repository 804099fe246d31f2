"""A two-deployment app in the style of Ray Serve's `text_ml.py` docs example."""

from __future__ import annotations

import os
from typing import Any

from surge import serve


@serve.deployment(max_ongoing_requests=4)
class Translator:
    def __init__(self) -> None:
        self.language = "french"

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.language = config.get("language", "french")

    def translate(self, text: str) -> str:
        return f"{self.language}:{text}"


@serve.deployment
class Summarizer:
    def __init__(self, translator: Any) -> None:
        self.translator = translator
        self.min_length = 1

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.min_length = int(config.get("min_length", 1))

    async def __call__(self, request: Any) -> dict[str, Any]:
        text = request.query_params.get("text", "")
        translated = await self.translator.translate.remote(text)
        return {"text": translated, "min_length": self.min_length,
                "env": os.environ.get("TEXT_ML_MODE", "")}


app = Summarizer.bind(Translator.bind())


@serve.deployment(max_ongoing_requests=4)
class Batched:
    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def __call__(self, requests: list[Any]) -> list[str]:
        return ["ok" for _ in requests]


batched = Batched.bind()


def builder(args: dict[str, Any]) -> Any:
    """An application builder, as Ray allows: import_path points here, args come in."""
    return Translator.options(user_config={"language": args.get("language", "german")}).bind()
