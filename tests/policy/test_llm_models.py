"""resolve_model: a request's `model` -> (its deployment, its multiplexed model id), as Ray
Serve LLM's ingress sets them (base models unpinned, `base:adapter` routed by adapter)."""

from __future__ import annotations

import pytest

from surge.policy.llm_models import (
    decode_model,
    lora_model_id,
    path_model,
    resolve_model,
    split_lora_id,
)

ONE = {"tiny": "LLMServer:tiny"}
TWO = {"tiny": "LLMServer:tiny", "big": "LLMServer:big"}


@pytest.mark.parametrize(("model", "served", "expected"), [
    (None, ONE, ("LLMServer:tiny", "")),            # omitted with one model: that model
    (None, TWO, (None, "")),                        # omitted with two: the caller says 400
    ("tiny", TWO, ("LLMServer:tiny", "")),          # a base model: no id, every replica
    ("big", TWO, ("LLMServer:big", "")),
    ("tiny:shout", TWO, ("LLMServer:tiny", "tiny:shout")),  # an adapter: the whole id
    ("tiny:a:b", ONE, ("LLMServer:tiny", "tiny:a:b")),      # Ray: adapter = after first ':'
    ("tiny:", ONE, (None, "")),                     # no adapter name
    ("other:shout", ONE, (None, "")),               # not served here
    ("nope", ONE, (None, "")),
    ("", ONE, (None, "")),
])
def test_resolve_model(model: str | None, served: dict[str, str],
                       expected: tuple[str | None, str]) -> None:
    assert resolve_model(model, served) == expected


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"model": "tiny:shout", "messages": []}', "tiny:shout"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', None),
    (b'{"model": null}', None),
    (b'{"model": 3}', None),           # not a string: not a model this decides on
    (b"not json", None),
    (b"", None),
    (b"[1, 2]", None),
])
def test_decode_model_reads_only_the_model_field(body: bytes, expected: str | None) -> None:
    assert decode_model(body) == expected


def test_lora_model_id_and_split() -> None:
    assert lora_model_id("tiny:shout", "tiny") == "tiny:shout"
    assert lora_model_id("tiny", "tiny") == ""
    assert lora_model_id(None, "tiny") == ""
    assert lora_model_id("big:shout", "tiny") == ""
    assert split_lora_id("tiny:a:b") == ("tiny", "a:b")
    assert split_lora_id("tiny") == ("tiny", "")


@pytest.mark.parametrize(("path", "expected"), [
    ("/v1/models/tiny:shout", "tiny:shout"),
    ("/lora/v1/models/tiny", "tiny"),      # under a route prefix
    ("/v1/models/", None),
    ("/v1/models", None),
    ("/v1/chat/completions", None),
])
def test_path_model(path: str, expected: str | None) -> None:
    assert path_model(path) == expected
