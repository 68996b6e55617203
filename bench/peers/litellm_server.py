"""LiteLLM's proxy (`litellm --config`), relaying chat completions to the fake upstream, as its own process.

    bench/.venv-litellm/bin/python bench/peers/litellm_server.py --upstream URL

Prints {"url": ..., "api_key": ...} on one line once the proxy answers its liveness probe, and serves until
SIGTERM. LiteLLM has no per-rollout endpoint: every rollout posts to the same `/v1/chat/completions` (model
`policy`), so it is the plain relay to compare black_box with. One uvicorn worker, a random master key (the key
every agent sends; the proxy refuses to start without one), no database, the local model-cost map (the machine may
be offline). The proxy runs as a child of this script, which stops it on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

_START_TIMEOUT_S = 120.0  # importing the proxy takes seconds; far more on a busy machine
_CONFIG = """model_list:
  - model_name: policy
    litellm_params:
      model: openai/instant
      api_base: {upstream}/v1
      api_key: EMPTY
litellm_settings:
  drop_params: true
  turn_off_message_logging: true
"""


def free_port() -> int:
    with socket.socket() as probe:  # the proxy's CLI takes no port 0: borrow a free one
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_live(url: str, proxy: subprocess.Popen) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proxy.poll() is not None:
            raise SystemExit(f"litellm exited with {proxy.returncode}")
        try:
            with urllib.request.urlopen(url + "/health/liveliness", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"litellm did not answer within {_START_TIMEOUT_S:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the fake upstream's base URL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-litellm-") as work:
        config = Path(work) / "config.yaml"
        config.write_text(_CONFIG.format(upstream=args.upstream.rstrip("/")))
        port = free_port()
        master_key = "sk-" + secrets.token_hex(16)  # it refuses to start without one; agents send it as their key
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
               "LITELLM_MASTER_KEY": master_key}
        litellm = Path(sys.executable).with_name("litellm")
        proxy = subprocess.Popen([str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                                  "--num_workers", "1"], env=env, stdout=sys.stderr, stdin=subprocess.DEVNULL)
        signal.signal(signal.SIGTERM, lambda *_: proxy.terminate())
        try:
            url = f"http://127.0.0.1:{port}"
            wait_live(url, proxy)
            print(json.dumps({"url": url, "api_key": master_key}), flush=True)
            proxy.wait()
        finally:
            if proxy.poll() is None:
                proxy.terminate()
                proxy.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
