"""Configuration of the interception server, one frozen keyword-only dataclass per component.

Built in one place (`interceptor serve`'s argument parsing, or by the Python caller); nothing else reads the
environment. Secrets (the upstream API key, the admin token) are excluded from `repr`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from interceptor.errors import ConfigError

__all__ = ["Mode", "SamplingSettings", "ServerConfig", "UpstreamConfig"]

Mode = Literal["interception_gate", "black_box"]


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """Per-rollout sampling. A value set here wins over the agent's request (the trainer pins what it trains
    with); a value left None takes the agent's, then the upstream's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name, kinds in (("temperature", (int, float)), ("top_p", (int, float)), ("top_k", (int,)),
                            ("max_tokens", (int,)), ("seed", (int,))):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise ConfigError(f"{name} must be {'a number' if float in kinds else 'an integer'}, not {value!r}"[:200])
        if self.seed is not None and not 0 <= self.seed < 2**63 - 2**32:
            raise ConfigError("seed must be from 0 to 2**63 - 2**32 (each turn adds its number)")
        if self.top_k is not None and not -1 <= self.top_k < 2**31:
            raise ConfigError("top_k must be -1 (off) or a positive integer")
        if self.temperature is not None and not 0.0 <= self.temperature <= 2.0:
            raise ConfigError("temperature must be from 0 to 2")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p must be in (0, 1]")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError("max_tokens must be positive")

    @classmethod
    def from_dict(cls, data: dict) -> SamplingSettings:
        unknown = set(data) - {"temperature", "top_p", "top_k", "max_tokens", "seed"}
        if unknown:
            raise ConfigError(f"unknown sampling settings: {sorted(unknown)}")
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class UpstreamConfig:
    base_url: str  # e.g. http://127.0.0.1:8000 (vLLM, the local engine) or https://api.example.com (black_box)
    model: str | None = None  # the upstream's model name; discovered from /v1/models when None
    api_key: str | None = field(default=None, repr=False)  # black_box only; never taken from the agent
    request_timeout_s: float = 600.0  # one generation; long, since a CPU policy can be slow
    connect_timeout_s: float = 10.0
    # Upstream calls one turn may cost in all, shared with the agent's own retries of that turn (same body):
    # connection errors, resets, 408/409/429/5xx and aborted generations are retried within it.
    attempts: int = 4
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 4.0
    max_connections: int = 256
    lean_client: bool = True  # JSON calls to a plain-http upstream through the lean HTTP/1.1 pool (http1.py)
    # Further replicas of the same policy beside `base_url`: each rollout is pinned to one (`replicas.py`).
    replicas: tuple[str, ...] = ()
    health_interval_s: float = 2.0  # replicas' /health, when there are several

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(self.replicas))
        for url in (self.base_url, *self.replicas):
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ConfigError(f"upstream URL must be http(s): {url!r}")
        if len({self.base_url.rstrip("/"), *(u.rstrip("/") for u in self.replicas)}) != 1 + len(self.replicas):
            raise ConfigError("the upstream replicas must be distinct URLs")
        if self.api_key:  # "" is no key, as an empty environment variable means
            self._check_api_key()
        if self.attempts < 1:
            raise ConfigError("attempts must be at least 1")
        if self.health_interval_s <= 0:
            raise ConfigError("health_interval_s must be positive")

    def _check_api_key(self) -> None:
        """The key must fit in a header. Beside `user:password@` in an upstream URL it is refused: the URL's
        credentials are Basic authentication in the Authorization header, where the key goes as a Bearer token, so
        one of the two would be dropped, and which one the upstream wants is the user's to say; a guess would fail
        every turn with a 401, where this fails once, at start."""
        if not isinstance(self.api_key, str) or not all(" " <= c <= "~" for c in self.api_key):
            raise ConfigError("the upstream API key must be a string of visible ASCII (it is sent in a header)")
        for url in (self.base_url, *self.replicas):
            parts = urlsplit(url)
            if parts.username is not None or parts.password is not None:
                raise ConfigError(
                    f"the upstream URL for {parts.hostname} has credentials (user:password@) and an API key is set: "
                    "both would be the Authorization header; keep one (the URL's for Basic authentication, the key "
                    "for a Bearer token)"
                )

    @property
    def root(self) -> str:
        """The base URL without a trailing `/v1`, so both spellings work."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    upstream: UpstreamConfig
    mode: Mode = "interception_gate"
    model_dir: Path | None = None  # tokenizer + chat template (interception_gate)
    chat_template: str | None = None
    training_template: bool = False  # TRL's prefix-preserving variant of the model's template
    tiktoken_twin: bool = True  # ASCII text encoded by tiktoken where it gives the tokenizer's ids (bpe_twin.py)
    suffix_writer: bool = True  # steady turns' suffixes written without the template where known (suffix_writer.py)
    host: str = "127.0.0.1"
    port: int = 0
    fast_lane: bool = True  # the gate's turns and JSON routes served off the socket, the rest by aiohttp (lane.py)
    public_host: str | None = None  # the host agents use in their base URL, when not `host`
    # The box port (`box_port.py`): the rollout routes alone, for boxes not on this host's loopback. `box_listen`
    # (HOST:PORT) listens for the server's whole life; drivers may expose more addresses on the same port.
    box_listen: str | None = None
    box_url: str | None = None  # what boxes are told when it is not http://<box_listen> (a public name, a tunnel)
    admin_token: str | None = field(default=None, repr=False)  # guards /rollouts; None: no HTTP admin API
    # JSON Lines file; every finished rollout is appended and fsynced. Live rollouts are journaled beside it
    # (`<record_path>.journal.*`) and come back as `interrupted` records after a crash.
    record_path: Path | None = None
    served_model_name: str = "policy"  # the model id agents see
    max_model_len: int | None = None  # discovered from the upstream's /v1/models when None
    default_max_tokens: int = 2048  # when neither the rollout nor the agent sets one
    max_body_bytes: int = 16 * 1024 * 1024  # ~4M tokens of text: far past any context window, and bounded
    # Request bodies still arriving, all connections together (`body_budget.py`): past it a request gets a 503 and
    # its connection closed. A 100k-token turn's body is ~0.5 MB and arrives in one read on loopback.
    max_pending_body_bytes: int = 128 * 1024 * 1024
    body_timeout_s: float = 60.0  # a body aiohttp reads must be whole by then (408); the lane's idle timer is its own
    # A stream's status is held back this long for the answer (so a failure is still an HTTP status the SDK
    # retries); past it, headers go out and an SSE comment every `keepalive_s` keeps the connection open.
    stream_hold_s: float = 60.0
    keepalive_s: float = 5.0
    shutdown_grace_s: float = 5.0  # on exit, in-flight requests get this long before they are cancelled
    # interception_gate: how long a worker thread rendering a large request may keep the GIL from the event loop
    # (`sys.setswitchinterval` while the server runs; Python's own is 5 ms, a stall every other rollout feels).
    # None leaves the process's setting as it is.
    gil_switch_interval_s: float | None = 0.0005
    # The objects that exist once the server has started (the libraries, the tokenizer, the template: 225k with
    # Qwen's tokenizer) are kept out of the cyclic collector's passes while it runs (`gc.freeze`): a full pass then
    # walks what the rollouts hold, instead of stalling every rollout for 100+ ms every few seconds of load.
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        if self.gil_switch_interval_s is not None and not 0 < self.gil_switch_interval_s <= 1:
            raise ConfigError("gil_switch_interval_s must be in (0, 1] seconds, or None")
        if self.mode not in ("interception_gate", "black_box"):
            raise ConfigError(f"unknown mode {self.mode!r}")
        if self.mode == "interception_gate" and self.model_dir is None:
            raise ConfigError("interception_gate needs model_dir (the tokenizer and chat template)")
        if self.keepalive_s <= 0 or self.stream_hold_s < 0:
            raise ConfigError("keepalive_s must be positive and stream_hold_s not negative")
        if self.max_pending_body_bytes < self.max_body_bytes:
            raise ConfigError("max_pending_body_bytes must hold at least one body of max_body_bytes")
        if self.body_timeout_s <= 0:
            raise ConfigError("body_timeout_s must be positive")
        if self.box_listen is not None:
            parse_host_port(self.box_listen, what="box_listen")
        if self.box_url is not None and (self.box_listen is None or not self.box_url.startswith(("http://", "https://"))):
            raise ConfigError("box_url is the http(s) URL boxes use for box_listen's address: give box_listen too")


def parse_host_port(value: str, *, what: str) -> tuple[str, int]:
    """`HOST:PORT` (`[v6]:PORT`), as `--box-listen` takes it; port 0 picks one."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{what} is HOST:PORT (a port from 0 to 65535), not {value!r}")
    return host, int(port)
