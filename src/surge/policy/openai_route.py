"""Which deployment takes an OpenAI request: decided from its path and the body's `model`.

An OpenAI app with several models has an ingress deployment (OpenAiIngress) in front of
one deployment per model. The proxy skips that hop where it can: a `POST` to
`/v1/chat/completions`, `/v1/completions` or `/v1/embeddings` whose whole body it holds
has only its `model` field decoded (msgspec skips every other value without building
it: microseconds for a chat body) and goes straight to that model's deployment. Model
ids as Ray reads them: the exact id, else `base:adapter` goes to `base`'s deployment;
an omitted (or null) model with one model served goes to it.

Everything else goes to the ingress, which answers as it always did: other paths
(`GET /v1/models`), a body still streaming in or over `MAX_MODEL_BODY_BYTES`, one that is
not a JSON object with a string `model` (400 there), an omitted model among several
(400), an unknown model (OpenAI's 404). The reason is part of each decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from surge.policy.llm_models import MODEL_FIELD, split_lora_id

__all__ = ["ENDPOINTS", "MAX_MODEL_BODY_BYTES", "ModelChoice", "ModelTable",
           "choose_deployment"]

# The proxy holds a body up to this size whole before it forwards it (a larger one
# streams: proxy/h1.py UPLOAD_STREAM_BYTES), and skimming that much JSON for one field
# takes ~0.1 ms on the proxy's loop: the most one request may cost it.
MAX_MODEL_BODY_BYTES = 256 * 1024
# The endpoints whose body names the model (relative to the application's route prefix).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")

# Reasons, one per outcome.
MODEL = "model"  # the exact model id
ADAPTER = "adapter"  # base:adapter -> the base model's deployment
ONLY = "only_model"  # no model named; one served
OTHER_PATH = "other_path"
STREAMED = "streamed_body"
TOO_LARGE = "body_too_large"
UNREADABLE = "unreadable_body"
UNNAMED = "model_omitted"  # several served: the ingress answers 400
UNKNOWN = "unknown_model"  # the ingress answers OpenAI's 404


class ModelChoice(NamedTuple):
    deployment: str | None  # None: the application's ingress
    reason: str


class ModelTable:
    """An app's model ids and their deployments, with the full paths of ENDPOINTS."""

    __slots__ = ("by_model", "only", "paths")

    def __init__(self, route_prefix: str, models: Iterable[tuple[str, str]]) -> None:
        self.by_model = dict(models)
        # An omitted model is the one served, as Ray reads it; among several, nobody's.
        self.only = next(iter(self.by_model.values())) if len(self.by_model) == 1 else None
        base = route_prefix.rstrip("/")
        self.paths = frozenset(base + endpoint for endpoint in ENDPOINTS)

    def __repr__(self) -> str:
        return f"<ModelTable {self.by_model} only={self.only}>"


def choose_deployment(table: ModelTable, method: str, path: str, body: bytes,
                      streamed: bool = False) -> ModelChoice:
    """The deployment for a request to `path` (the whole path, prefix included)."""
    if method != "POST" or path not in table.paths:
        return ModelChoice(None, OTHER_PATH)
    if streamed:
        return ModelChoice(None, STREAMED)
    if len(body) > MAX_MODEL_BODY_BYTES:
        return ModelChoice(None, TOO_LARGE)
    try:
        model = MODEL_FIELD.decode(body).model
    except msgspec.MsgspecError:
        return ModelChoice(None, UNREADABLE)
    if model is None:
        return ModelChoice(table.only, ONLY) if table.only is not None \
            else ModelChoice(None, UNNAMED)
    deployment = table.by_model.get(model)
    if deployment is not None:
        return ModelChoice(deployment, MODEL)
    base, adapter = split_lora_id(model)
    deployment = table.by_model.get(base) if adapter else None
    if deployment is not None:
        return ModelChoice(deployment, ADAPTER)
    return ModelChoice(None, UNKNOWN)
