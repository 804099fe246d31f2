"""`surge.serve.llm`, as `ray.serve.llm`: LLM deployments and the OpenAI app.

Re-exports only; the implementation is surge.llm (docs/llm.md).
"""

from surge.llm import (
    LLMConfig,
    LLMServer,
    LLMServingArgs,
    LoraConfig,
    ModelLoadingConfig,
    build_llm_deployment,
    build_openai_app,
)

__all__ = ["LLMConfig", "LLMServer", "LLMServingArgs", "LoraConfig", "ModelLoadingConfig",
           "build_llm_deployment", "build_openai_app"]
