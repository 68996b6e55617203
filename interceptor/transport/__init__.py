"""Transport: how requests reach the server, and how the server reaches the policy server.

`lane` answers the gate's turns and the JSON routes straight off the socket (`lane_routes` says which); aiohttp
serves the rest. `upstream` is the client of the policy server (vLLM or the local engine) and, in black_box mode, of
any OpenAI-style API, over `http1`'s keep-alive pool; `replicas` pins each rollout to one of several policy servers.

Accelerator: the fast lane. Plain path: aiohttp. Flag: `ServerConfig.fast_lane`. Audit:
`tests/interceptor/test_fast_lane.py` holds the two paths' answers equal (statuses, error bodies, events, the
prompts the upstream sees).

Accelerator: the lean HTTP/1.1 pool (`http1`). Plain path: aiohttp's client. Flag: `UpstreamConfig.lean_client`.
Audit: `tests/interceptor/test_http1.py`.
"""
