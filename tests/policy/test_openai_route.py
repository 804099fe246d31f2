"""policy/openai_route.py: an OpenAI request's deployment, from its path and `model`."""

from __future__ import annotations

import json

import pytest

from surge.policy.openai_route import (
    ENDPOINTS,
    MAX_MODEL_BODY_BYTES,
    ModelChoice,
    ModelTable,
    choose_deployment,
)

TWO = ModelTable("/", [("a", "LLMServer:a"), ("org/b", "LLMServer:org--b")])
ONE = ModelTable("/llm", [("a", "LLMServer:a")])
CHAT = "/v1/chat/completions"


def body(**fields: object) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize(
    ("table", "method", "path", "payload", "expected"),
    [
        (TWO, "POST", CHAT, body(model="a"), ("LLMServer:a", "model")),
        (TWO, "POST", "/v1/completions", b'{"prompt": "x", "model": "org/b"}',
         ("LLMServer:org--b", "model")),
        (TWO, "POST", "/v1/embeddings", b'{"model": "a", "input": "x"}',
         ("LLMServer:a", "model")),
        (TWO, "POST", CHAT, body(model="a:shout"), ("LLMServer:a", "adapter")),
        (TWO, "POST", CHAT, body(model="org/b:x:y"), ("LLMServer:org--b", "adapter")),
        (TWO, "POST", CHAT, body(model="c"), (None, "unknown_model")),
        (TWO, "POST", CHAT, body(model="c:a"), (None, "unknown_model")),
        (TWO, "POST", CHAT, body(model=":a"), (None, "unknown_model")),
        (TWO, "POST", CHAT, body(), (None, "model_omitted")),
        (TWO, "POST", CHAT, body(model=None), (None, "model_omitted")),
        (ONE, "POST", "/llm" + CHAT, body(), ("LLMServer:a", "only_model")),
        (ONE, "POST", "/llm" + CHAT, body(model="a"), ("LLMServer:a", "model")),
        (ONE, "POST", CHAT, body(model="a"), (None, "other_path")),  # not under /llm
        (TWO, "GET", "/v1/models", b"", (None, "other_path")),
        (TWO, "GET", CHAT, b"", (None, "other_path")),
        (TWO, "POST", "/v1/models", body(model="a"), (None, "other_path")),
        (TWO, "POST", CHAT + "/", body(model="a"), (None, "other_path")),
        (TWO, "POST", "/x" + CHAT, body(model="a"), (None, "other_path")),
        (TWO, "POST", CHAT, b"not json", (None, "unreadable_body")),
        (TWO, "POST", CHAT, b'{"model": "a", "messages": [', (None, "unreadable_body")),
        (TWO, "POST", CHAT, b'{"model": 7}', (None, "unreadable_body")),
        (TWO, "POST", CHAT, b'["a"]', (None, "unreadable_body")),
        (TWO, "POST", CHAT, b"", (None, "unreadable_body")),
    ],
)
def test_choice(table: ModelTable, method: str, path: str, payload: bytes,
                expected: tuple[str | None, str]) -> None:
    assert choose_deployment(table, method, path, payload) == ModelChoice(*expected)


def test_every_endpoint_under_any_prefix() -> None:
    for prefix in ("/", "/llm", "/a/b"):
        table = ModelTable(prefix, [("a", "A")])
        for endpoint in ENDPOINTS:
            path = prefix.rstrip("/") + endpoint
            assert choose_deployment(table, "POST", path, b'{"model":"a"}').deployment == "A"


def test_streamed_and_large_bodies_go_to_the_ingress() -> None:
    assert choose_deployment(TWO, "POST", CHAT, body(model="a"), streamed=True) == \
        ModelChoice(None, "streamed_body")
    padding = "x" * MAX_MODEL_BODY_BYTES
    large = body(model="a", user=padding)
    assert choose_deployment(TWO, "POST", CHAT, large) == ModelChoice(None, "body_too_large")
    at_bound = body(model="a", user=padding[:MAX_MODEL_BODY_BYTES - len(body(model="a",
                                                                              user=""))])
    assert len(at_bound) == MAX_MODEL_BODY_BYTES
    assert choose_deployment(TWO, "POST", CHAT, at_bound).deployment == "LLMServer:a"


def test_the_model_field_is_found_anywhere_in_the_object() -> None:
    late = b'{"messages": [{"role": "user", "content": "{\\"model\\": \\"b\\"}"}], ' \
           b'"nested": {"model": "c"}, "model": "a"}'
    assert choose_deployment(TWO, "POST", CHAT, late).deployment == "LLMServer:a"


def test_repr_shows_the_table() -> None:
    assert repr(ONE) == "<ModelTable {'a': 'LLMServer:a'} only=LLMServer:a>"
    assert "only=None" in repr(TWO)
