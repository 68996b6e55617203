"""Where the policy is served, as `run`, `train`, `evaluate` and the fleet name it: `local` (the local engine in
this process) or the URLs of a vLLM server or of several replicas of it. Parsed once, at the edge."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LOCAL", "parse_upstream"]

LOCAL = "local"


def parse_upstream(value: str | Sequence[str]) -> tuple[str, ...]:
    """The policy server(s) a command or config names, parsed once at the edge: `("local",)` for the local engine,
    or the URLs of one vLLM server or of several replicas of it (a comma-separated string, or a list). Each URL
    itself is checked where it is used (`interceptor.UpstreamConfig`)."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(p, str) for p in parts):
        raise ValueError(f"upstream must be 'local' or URLs, not {value!r}")
    upstream = tuple(p.strip() for p in parts)
    if upstream == ("",):
        upstream = ()
    if "" in upstream:
        raise ValueError(f"upstream must be 'local' or URLs separated by commas, with none empty: {value!r}")
    if not upstream:
        raise ValueError("upstream needs 'local' or at least one URL")
    if LOCAL in upstream and len(upstream) > 1:
        raise ValueError("upstream is either 'local' or URLs of policy servers, not both")
    return upstream
