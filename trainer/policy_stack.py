"""One place that opens the policy stack: the policy server, the interception server in front of it, the runner.

    async with PolicyStack(StackConfig(upstream=("local",), model=Path("runs/model")), runner=configure) as stack:
        records = await stack.runner.run_tasks(tasks, n=4)

- The policy server: `upstream=("local",)` builds the embedded default in `model` if it is not there yet
  (`trainer.models.local_model`) and starts the local engine in this process (on `engine_device`, in `engine_dtype`);
  otherwise `upstream` is the URL of vLLM, or of several replicas of it (`interceptor.transport.replicas`: each rollout
  pinned to one), or of any OpenAI-style API in `black_box` mode (its key from `INTERCEPTOR_UPSTREAM_API_KEY`,
  never from argv).
- The interception server in `mode`, recording to `record_path`, on `host`:`port` (an admin API with
  `admin_token`; with `view`, the run viewer at `/view` on the same port).
- The runner, when `runner` is given: it is called with the started server (the agent's context window and the
  sandbox depend on it) and returns the `RunnerConfig`.

`interceptor run`, `interceptor train` and `interceptor demo` open their stacks here; everything opened is closed
in reverse order when the block ends, on every path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from agents.runner import Runner, RunnerConfig
from interceptor import InterceptionServer, ServerConfig, UpstreamConfig

from trainer.engine import EngineConfig, LocalEngine
from trainer.upstreams import LOCAL, parse_upstream

__all__ = ["PolicyStack", "StackConfig"]


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    upstream: tuple[str, ...] = (LOCAL,)  # "local", or the policy server's URL(s)
    model: Path | None = None  # local: where the model is (built there if missing); else the tokenizer's directory
    build_local_model: bool = True  # local: build the embedded default (else `model` must exist)
    mode: str = "interception_gate"
    record_path: Path | None = None
    served_model_name: str = "policy"
    engine_device: str = "cpu"
    engine_dtype: str = "float32"
    seed: int = 0
    host: str = "127.0.0.1"  # where the interception server listens (0.0.0.0 in a container: agents use loopback)
    port: int = 0
    admin_token: str | None = field(default=None, repr=False)  # the admin API and /metrics want it; None: no admin
    view: bool = False  # serve the viewer over record_path's directory at /view on the server's port
    box_listen: str | None = None  # HOST:PORT where remote boxes reach the rollout routes (`interceptor.box_port`)
    box_url: str | None = None  # what they are told, when not http://HOST:PORT

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream", parse_upstream(self.upstream))
        if self.upstream == (LOCAL,) and self.model is None:
            raise ValueError("the local engine needs a model directory")
        if self.model is not None:
            object.__setattr__(self, "model", Path(self.model))
        if self.view and self.record_path is None:
            raise ValueError("the viewer shows the run's records: view needs a record_path")

    @property
    def local(self) -> bool:
        return self.upstream == (LOCAL,)


class PolicyStack:
    def __init__(self, config: StackConfig, *, runner: Callable[[InterceptionServer], RunnerConfig] | None = None,
                 runner_options: dict | None = None) -> None:
        self.config = config
        self._runner_config = runner
        self._runner_options = runner_options or {}
        self.engine: LocalEngine | None = None
        self.server: InterceptionServer | None = None
        self.runner: Runner | None = None
        self.model_dir: Path | None = config.model
        self.upstream: UpstreamConfig | None = None
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> PolicyStack:
        config = self.config
        async with AsyncExitStack() as stack:
            if config.local:
                if config.build_local_model:
                    from trainer.models.local_model import prepare_local_model

                    self.model_dir = await prepare_local_model(config.model)
                self.engine = await stack.enter_async_context(LocalEngine(EngineConfig(
                    model=self.model_dir, port=0, served_model_name=config.served_model_name, seed=config.seed,
                    device=config.engine_device, dtype=config.engine_dtype,
                )))
                self.upstream = UpstreamConfig(base_url=self.engine.base_url)
            else:
                first, *others = config.upstream
                self.upstream = UpstreamConfig(base_url=first, replicas=tuple(others),
                                               api_key=os.environ.get("INTERCEPTOR_UPSTREAM_API_KEY"))
            mounts = ()
            if config.view:
                from interceptor.viewer.arguments import TOKEN_ENV
                from interceptor.viewer.main import open_viewer

                viewer = await asyncio.to_thread(open_viewer, config.record_path.parent, model=self.model_dir,
                                                 token=os.environ.get(TOKEN_ENV) or None)
                mounts = (("/view", viewer),)
            self.server = await stack.enter_async_context(InterceptionServer(ServerConfig(
                upstream=self.upstream, mode=config.mode, model_dir=self.model_dir, record_path=config.record_path,
                host=config.host, port=config.port, admin_token=config.admin_token,
                public_host="127.0.0.1" if config.host in ("0.0.0.0", "::") else None,
                box_listen=config.box_listen, box_url=config.box_url,
            ), mounts=mounts))
            if self._runner_config is not None:
                self.runner = await stack.enter_async_context(
                    Runner(self.server, self._runner_config(self.server), **self._runner_options)
                )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._stack.aclose()
