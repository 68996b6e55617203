"""The relay (`black_box` mode): each turn forwarded to any upstream API in the agent's own dialect, its trace recorded.

`turn` relays one turn (chat's shape), `shapes` has the Anthropic Messages and OpenAI Responses shapes.
"""
