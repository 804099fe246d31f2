"""`make_tiny_llama(directory)`: a tiny random Llama checkpoint that vLLM can serve on CPU.

No model hub is needed: a `LlamaForCausalLM` with random weights (hidden 64,
intermediate 128, 2 layers, 2 heads: head_dim 32, which vLLM's CPU attention kernels
support; 16 is not) and a byte-level BPE tokenizer trained here on a few sentences,
with a chat template (vLLM refuses chat without one). It says nothing sensible, but it
is a real model: real tokenization, chat templating, prefill and decode. Takes a few
seconds; needs `torch`, `transformers` and `tokenizers` (the LLM test environment).
`make_tiny_lora(directory, base)` writes a random LoRA adapter for it in PEFT's format
(`adapter_config.json` + `adapter_model.safetensors`, on q_proj and v_proj), large
enough to change what the model says.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "make_tiny_llama", "make_tiny_lora"]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Surge serves models when traffic hits like a cliff.",
    "Hello, how are you today? I am fine, thank you.",
    "Write a function that adds two numbers in Python.",
    "def add(a, b):\n    return a + b\n",
    "Shopping assistant: which shoes go with a blue suit?",
] * 20
_SPECIAL = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]


def make_tiny_llama(directory: str | Path, *, vocab_size: int = 512, seed: int = 0) -> Path:
    """Write the checkpoint to `directory` (once: an existing one is reused)."""
    path = Path(directory)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    tokenizers: Any = importlib.import_module("tokenizers")
    tokenizer = tokenizers.ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(_CORPUS, vocab_size=vocab_size, min_frequency=1,
                                  special_tokens=_SPECIAL)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    config = transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    with open(path / "surge-tiny.json", "w") as handle:
        json.dump({"made_by": "surge.testing.tiny_llm", "seed": seed}, handle)
    return path


def make_tiny_lora(directory: str | Path, base: str | Path, *, rank: int = 8,
                   seed: int = 1) -> Path:
    """A random LoRA adapter of `base` (a make_tiny_llama checkpoint) in `directory`."""
    path = Path(directory)
    if (path / "adapter_config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch: Any = importlib.import_module("torch")
    safetensors: Any = importlib.import_module("safetensors.torch")
    with open(Path(base) / "config.json") as handle:
        config = json.load(handle)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(hidden, rank, generator=generator)
    safetensors.save_file(tensors, str(path / "adapter_model.safetensors"))
    with open(path / "adapter_config.json", "w") as handle:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
                   "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
                   "target_modules": ["q_proj", "v_proj"], "fan_in_fan_out": False,
                   "modules_to_save": None, "base_model_name_or_path": str(base)}, handle)
    return path
