"""Fakes of surge's I/O boundaries, for tests of the shells (and of users' own code).

* `FakeClock`: a `surge.clock.Clock` that moves only when told (`advance`, `set_time_of_day`).
* `FakeBackend`: a `surge.backends.base.Backend` that records what it is asked and
  starts nothing; tests make its processes exit (`exit`) or land on nodes (`place`).
* `FakePeer`: the controller's end of a control connection, in memory: it records
  pushes and calls, and answers calls from a table (`answers`).
* `FakeLLMEngine`: a deterministic `surge.llm.engine.LLMEngine` (words are tokens), for
  tests of the OpenAI layer without a model: `LLMConfig(llm_engine=
  "surge.testing:FakeLLMEngine", ...)`.
* `MockVLLMEngine`: an engine that behaves like vLLM in time (scheduler steps, chunked
  prefill, a KV cache with prefix caching, eviction and preemption; vLLM's KV events),
  for benchmarks and tests of routing and scaling without a GPU:
  `llm_engine="surge.testing:MockVLLMEngine"`.
* `FakeReplica`: a replica as a router sees it, a frame server on loopback that
  answers, holds, rejects or dies on cue (the router's shell tests run on it).
* `FakeObjectStore`: cloud object storage in memory (`surge.llm.lora_cloud.ObjectStore`),
  for LoRA adapter downloads that fail on cue.
"""

from surge.testing.backend import FakeBackend, FakeProcess
from surge.testing.clock import FakeClock
from surge.testing.llm import FakeLLMEngine
from surge.testing.mock_vllm import MockVLLMEngine
from surge.testing.objects import FakeObjectStore
from surge.testing.peer import FakePeer
from surge.testing.replica import FakeReplica

__all__ = ["FakeBackend", "FakeClock", "FakeLLMEngine", "FakeObjectStore", "FakePeer",
           "FakeProcess", "FakeReplica", "MockVLLMEngine"]
