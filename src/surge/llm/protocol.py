"""OpenAI request bodies: decoded with msgspec into typed structs, checked, and turned
into the engine's `Prompt` and `SamplingParams`.

A body that does not decode, or a parameter out of its range, is an `OpenAIError`
(400, naming the parameter), as OpenAI and vLLM answer. Unknown fields are ignored, as
vLLM does, so clients that send newer fields keep working. vLLM's extra sampling fields
(`top_k`, `min_tokens`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, chat
template arguments) are understood.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from surge.llm.engine import SamplingParams

__all__ = ["ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest", "OpenAIError",
           "StreamOptions", "decode", "model_of", "sampling_params"]


class OpenAIError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message","type","param","code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Sampling(msgspec.Struct, kw_only=True):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    user: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_tokens: int = 0
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    request_id: str | None = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[Any]  # str, [str], [int] or [[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]  # str, [str], [int] or [[int]]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


T = TypeVar("T")
_PATH = re.compile(r"\$\.([A-Za-z_]+)")
_decoders: dict[type, msgspec.json.Decoder[Any]] = {}


def decode(body: bytes, kind: type[T]) -> T:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        request: T = decoder.decode(body)
    except msgspec.ValidationError as exc:
        found = _PATH.search(str(exc))
        raise OpenAIError(400, str(exc), param=found.group(1) if found else None) from None
    except msgspec.DecodeError as exc:
        raise OpenAIError(400, f"The request body is not valid JSON: {exc}") from None
    _check(request)
    return request


class _Model(msgspec.Struct):
    model: str | None = None


_model_decoder = msgspec.json.Decoder(_Model)


def model_of(body: bytes) -> str | None:
    """Only the `model` field of a body (for routing), or None when it has none."""
    try:
        return _model_decoder.decode(body).model
    except msgspec.MsgspecError:
        return None


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def _check_inputs(value: Any, param: str) -> None:
    """A prompt or embedding input: text, texts, token ids, or lists of token ids."""
    if value == "" or value == []:
        raise _bad(param, f"{param} must not be empty")
    if isinstance(value, str):
        return
    kinds = {type(item) for item in value}
    if kinds <= {str} or kinds <= {int}:
        return
    if kinds <= {list} and all(item and all(type(t) is int for t in item) for item in value):
        return
    raise _bad(param, f"{param} must be a string, a list of strings, a list of token ids or "
                      "a list of lists of token ids")


def _check(request: Any) -> None:
    if isinstance(request, EmbeddingRequest):
        _check_inputs(request.input, "input")
        if request.encoding_format not in ("float", "base64"):
            raise _bad("encoding_format", "encoding_format must be 'float' or 'base64'")
        return
    temperature = request.temperature
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise _bad("temperature", f"temperature must be in [0, 2], got {temperature}")
    if request.top_p is not None and not 0.0 < request.top_p <= 1.0:
        raise _bad("top_p", f"top_p must be in (0, 1], got {request.top_p}")
    if request.n is not None and request.n < 1:
        raise _bad("n", f"n must be at least 1, got {request.n}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise _bad(name, f"{name} must be in [-2, 2], got {value}")
    if request.stream_options is not None and not request.stream:
        raise _bad("stream_options", "Stream options can only be defined when `stream=True`.")
    if isinstance(request.stop, list) and len(request.stop) > 16:
        raise _bad("stop", "at most 16 stop sequences")
    if isinstance(request, ChatCompletionRequest):
        _check_chat(request)
    else:
        _check_inputs(request.prompt, "prompt")
        if request.logprobs is not None or request.echo or request.suffix:
            name = "logprobs" if request.logprobs is not None else \
                "echo" if request.echo else "suffix"
            raise _bad(name, f"{name} is not supported by surge's OpenAI server yet")
        if request.best_of is not None and request.best_of != (request.n or 1):
            raise _bad("best_of", "best_of other than n is not supported")


def _check_chat(request: ChatCompletionRequest) -> None:
    if not request.messages:
        raise _bad("messages", "messages must contain at least one message")
    for index, message in enumerate(request.messages):
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise _bad(f"messages.[{index}].role", f"invalid role {role!r} in message {index}")
    if request.logprobs or request.top_logprobs:
        raise _bad("logprobs", "logprobs are not supported by surge's OpenAI server yet")
    if request.response_format and request.response_format.get("type") not in (None, "text"):
        raise _bad("response_format", "response_format other than text is not supported "
                                      "by surge's OpenAI server yet")


def sampling_params(request: ChatCompletionRequest | CompletionRequest, prompt_tokens: int,
                    max_model_len: int) -> SamplingParams:
    """The engine's parameters; 400 when the prompt and max_tokens exceed the context."""
    wanted = request.max_tokens
    if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None:
        wanted = request.max_completion_tokens
    param = "max_tokens"
    if wanted is not None and wanted < 1:
        raise _bad(param, f"max_tokens must be at least 1, got {wanted}")
    room = max_model_len - prompt_tokens
    if room <= 0:
        raise _bad("messages" if isinstance(request, ChatCompletionRequest) else "prompt",
                   f"This model's maximum context length is {max_model_len} tokens. However, "
                   f"your request has {prompt_tokens} input tokens. Please reduce the length "
                   "of the input.")
    if wanted is not None and wanted > room:
        raise _bad(param, f"This model's maximum context length is {max_model_len} tokens. "
                          f"However, you requested {wanted + prompt_tokens} tokens "
                          f"({prompt_tokens} in the messages, {wanted} in the completion). "
                          "Please reduce the length of the messages or completion.")
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    return SamplingParams(
        max_tokens=wanted if wanted is not None else room,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=-1 if request.top_k is None else request.top_k,
        min_tokens=request.min_tokens, n=request.n or 1, seed=request.seed, stop=stop,
        stop_token_ids=tuple(request.stop_token_ids or ()),
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        repetition_penalty=request.repetition_penalty or 1.0,
        ignore_eos=request.ignore_eos)
