"""An application as sent to the controller, and its bearer-token authentication."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surge.config.deployment import DeploymentSpec
from surge.config.schema import require
from surge.model import AccessTokens, ModelRoutes


@dataclass(frozen=True, kw_only=True)
class AuthConfig:
    """Bearer-token authentication of one application's HTTP route (read by api/auth.py).

    It says where the tokens are, never what they are: `tokens_env` names an environment
    variable of the process that deploys (tokens separated by commas or whitespace),
    `tokens_file` a file with one token per line (`#` starts a comment). From Python,
    `tokens` may give them directly (say, fetched from a secrets manager); a config file
    cannot. A request needs `Authorization: Bearer <one of them>`.
    """

    tokens_env: str | None = None
    tokens_file: str | None = None
    tokens: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        env = self.tokens_env
        require(env is None or (isinstance(env, str) and env.isidentifier()),
                f"tokens_env must name an environment variable (like APP_TOKENS), "
                f"got {env!r}.")
        require(self.tokens_file is None or (isinstance(self.tokens_file, str)
                                             and bool(self.tokens_file)),
                f"tokens_file must be the path of a file, got {self.tokens_file!r}.")
        require(isinstance(self.tokens, list | tuple)
                and all(isinstance(t, str) for t in self.tokens),
                "tokens must be a list of strings.")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        require(env is not None or self.tokens_file is not None or bool(self.tokens),
                "auth needs tokens_env (an environment variable holding the tokens) or "
                "tokens_file (a file with one token per line).")


@dataclass(frozen=True, kw_only=True)
class AppSpec:
    """One application: its route, its ingress deployment, and all its deployments."""

    name: str
    route_prefix: str | None
    ingress: str
    deployments: tuple[DeploymentSpec, ...]
    sys_path: tuple[str, ...] = ()
    auth: AccessTokens | None = None  # None: HTTP requests need no credentials
    # Declarative deploys (a config file, the REST API): the application's entry as
    # written, for `serve config` and Ray's REST API; None for serve.run (imperative).
    source_config: Mapping[str, Any] | None = None
    # An OpenAI app (build_openai_app with an ingress): the deployment of each model, for
    # the proxy to route by the body's `model` field (ModelRoutes); None for any other.
    model_routes: ModelRoutes | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.name, str), "application name must be a string.")
        problem = route_prefix_problem(self.route_prefix)
        require(problem is None, problem or "")
        names = [d.config.name for d in self.deployments]
        require(len(names) == len(set(names)),
                f"application {self.name!r} has two deployments with the same name; give "
                "one of them another name with .options(name=...).")
        require(self.ingress in names, f"ingress {self.ingress!r} is not among the deployments.")


def route_prefix_problem(prefix: object) -> str | None:
    """What is wrong with an application's route prefix, in Ray Serve's words; None: fine.

    None (no HTTP route) is fine; a prefix starts with '/', has no trailing '/' (but "/"
    itself) and no '{' or '}' (path parameters belong to the app's own routes)."""
    if prefix is None:
        return None
    if not isinstance(prefix, str):
        return f"Invalid route_prefix {prefix!r}, must be a string or None."
    if not prefix.startswith("/"):
        return f"Invalid route_prefix '{prefix}', must start with a forward slash ('/')."
    if prefix != "/" and prefix.endswith("/"):
        return f"Invalid route_prefix '{prefix}', may not end with a trailing '/'."
    if "{" in prefix or "}" in prefix:
        return f"Invalid route_prefix '{prefix}', may not contain wildcards."
    return None
