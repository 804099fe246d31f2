"""LLM serving: Ray Serve LLM's API (`surge.serve.llm`) on an engine protocol.

`config` (LLMConfig and friends) → `builders` (deployments and the OpenAI app) →
`server` (LLMServer: the engine in a replica, the app's ingress for one model) and
`ingress` (OpenAiIngress: several models behind one endpoint) → `asgi` (the OpenAI HTTP
API as bytes) → `service` (requests over one engine) → `protocol` / `responses` (OpenAI's
request and response shapes) → `engine` (the protocol every engine speaks;
`vllm_engine` is vLLM's `AsyncLLM` behind it). `metrics` records TTFT, inter-token
latency, tokens and the engine's load in vLLM's names. The docs: docs/llm.md.
"""

from surge.llm.builders import build_llm_deployment, build_openai_app
from surge.llm.config import LLMConfig, LLMServingArgs, LoraConfig, ModelLoadingConfig
from surge.llm.ingress import OpenAiIngress
from surge.llm.server import LLMServer

__all__ = ["LLMConfig", "LLMServer", "LLMServingArgs", "LoraConfig", "ModelLoadingConfig",
           "OpenAiIngress", "build_llm_deployment", "build_openai_app"]
