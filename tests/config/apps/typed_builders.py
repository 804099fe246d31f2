"""Application builders whose argument is a pydantic model, v2 and v1 (Ray takes both)."""

from __future__ import annotations

from typing import Any

import pydantic
import pydantic.v1

from surge import serve


@serve.deployment
class Greeter:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting


class ArgsV2(pydantic.BaseModel):
    greeting: str
    replicas: int


class ArgsV1(pydantic.v1.BaseModel):
    greeting: str
    replicas: int


def build_v2(args: ArgsV2) -> Any:
    assert isinstance(args, ArgsV2)
    return Greeter.options(num_replicas=args.replicas).bind(args.greeting)


def build_v1(args: ArgsV1) -> Any:
    assert isinstance(args, ArgsV1)
    return Greeter.options(num_replicas=args.replicas).bind(args.greeting)


def build_untyped(args: dict[str, str]) -> Any:
    # A CLI's key=value arguments are strings; Ray's num_replicas takes "2" as 2.
    return Greeter.options(num_replicas=args["replicas"]).bind(args["greeting"])
