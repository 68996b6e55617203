"""The local engine's HTTP face: the part of vLLM's OpenAI server this project uses.

`server` builds the application (with the dev endpoints of `VLLM_SERVER_DEV_MODE=1`); `completions` and `chat` are
the two generation endpoints, `checks` the request checks they share, `fields` typed reads of request fields,
`keys` the application's typed state keys.
"""
