"""The wire: what agents send and what they get back, in each dialect.

Requests are parsed into a `ChatRequest` (`protocol`; Anthropic Messages and OpenAI Responses convert into it in
`dialects`), bodies are read once (`request_body`, under the server-wide `body_budget`) and, per rollout, parsed only
where they differ from the last one (`body_cache`, through `incoming`; values many rollouts send alike are held once
by `shared_values`); replies and their streams are built in `replies` and `streaming`, and sampled text becomes an
assistant message in `parsing`.

Accelerator: the incremental read (`body_cache`). Plain path: parse the whole body; fast path: parse only the bytes
after the part the last body shared; always on; audit: `tests/interceptor/test_incremental_parse.py` holds each
dialect's incremental read to its whole parse.
"""
