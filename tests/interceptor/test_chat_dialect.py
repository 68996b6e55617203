"""What the chat completions dialect recognises in a request: Pi's and OpenCode's summary requests (a context
summarizer's system prompt, no tools) are compaction requests, so the sample they start records why; a request
that merely mentions summarising, or offers tools, is an ordinary turn."""

from __future__ import annotations

import pytest

from interceptor.wire.dialects.chat import CHAT

HISTORY = "<conversation>\n[User]: List some numbers.\n[Assistant]: seq 1000 1600\n</conversation>"


@pytest.mark.parametrize("system", [
    "You are a context summarization assistant. Your task is to read a conversation ...",  # Pi 0.73
    "You are a context summarization agent. Summarize the conversation ...",  # OpenCode 1.18
], ids=["pi", "opencode"])
def test_a_summarizers_request_without_tools_is_a_compaction_request(system):
    chat = CHAT.parse({"model": "policy", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": HISTORY}]})
    assert chat.request_kind == "compaction"


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "system", "content": "You are a coding agent."},
                  {"role": "user", "content": "Summarize the conversation so far."}]},
    {"messages": [{"role": "user", "content": "You are a context summarization assistant."}]},
    {"messages": [{"role": "system", "content": "You are a context summarization assistant."},
                  {"role": "user", "content": HISTORY}],
     "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]},
], ids=["asks-to-summarize", "summarizer-as-user", "with-tools"])
def test_other_requests_are_ordinary_turns(body):
    assert CHAT.parse({"model": "policy", **body}).request_kind is None
