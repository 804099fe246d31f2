"""Which deployment an OpenAI request's `model` names, and the multiplexed id it carries.

Ray Serve LLM names a LoRA adapter `base:adapter` (everything after the first `:` is the
adapter) and sends such a request with `multiplexed_model_id = "base:adapter"`, so the
multiplexing router sends it to a replica that already holds the adapter; a request for
the base model itself carries no id and is balanced over every replica (each holds the
base). `resolve_model` is that decision for a table of served base models (one entry for
a one-model app, whose LLMServer is the ingress; several for a multi-model endpoint);
`decode_model` reads only the `model` field of a JSON body, in microseconds, and
`path_model` the id of a `GET /v1/models/{id}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import msgspec

__all__ = ["MODEL_FIELD", "decode_model", "lora_model_id", "path_model", "resolve_model",
           "split_lora_id"]

MODELS_PATH = "/v1/models/"

D = TypeVar("D")


class _Model(msgspec.Struct):
    model: str | None = None


# Decodes the `model` field alone (msgspec skips every other value without building it).
MODEL_FIELD = msgspec.json.Decoder(_Model)


def decode_model(body: bytes) -> str | None:
    """The body's `model` field, or None when it has none or is not a JSON object."""
    try:
        return MODEL_FIELD.decode(body).model
    except msgspec.MsgspecError:
        return None


def path_model(path: str) -> str | None:
    """The id in a `.../v1/models/{id}` path (a model card: its holder answers it)."""
    _, found, model = path.rpartition(MODELS_PATH)
    return model or None if found else None


def split_lora_id(model: str) -> tuple[str, str]:
    """(base, adapter) of `base:adapter`; adapter "" when `model` names no adapter."""
    base, _, adapter = model.partition(":")
    return base, adapter


def resolve_model(model: str | None, served: Mapping[str, D]) -> tuple[D | None, str]:
    """(what serves `model`, its multiplexed model id) given base model id -> target.

    No model: the only target when there is one. A base model: its target, no id. An
    adapter of a served base: the base's target, and the whole `base:adapter` as the id.
    Anything else: (None, ""), for the caller to answer 404 (or to let the server do so).
    """
    if model is None:
        if len(served) == 1:
            return next(iter(served.values())), ""
        return None, ""
    target = served.get(model)
    if target is not None:
        return target, ""
    base, adapter = split_lora_id(model)
    target = served.get(base)
    if target is None or not adapter:
        return None, ""
    return target, model


def lora_model_id(model: str | None, base: str) -> str:
    """The multiplexed model id of a request for `model` to the server of `base`."""
    return resolve_model(model, {base: base})[1]
