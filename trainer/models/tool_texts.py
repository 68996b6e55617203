"""The texts synthetic training episodes are drawn from (`trainer.models.tool_episodes`): task phrasings, distractions,
system prompts, what agents put around a task, shell names in prose, tool responses and other tools."""

from __future__ import annotations

__all__ = ["AFTER_SYSTEMS", "DISTRACTIONS", "FILLER_WORDS", "OTHER_TOOLS", "SHELL_MENTIONS", "SHELL_MENTION_RATE",
           "SHELL_WORDS", "SHORT_SYSTEMS", "TASKS", "TASK_PREFIXES", "TOOL_OUTPUTS"]

TASKS = (
    "Submit the answer {n}.",
    "Please submit the answer {n}.",
    "Submit the answer {n} and stop.",
    "Your job: submit the answer {n} using the shell.",
    "Use the shell to submit the answer {n}, then you are done.",
    "The result is known. Submit the answer {n}.",
    "Run the answer command to submit the answer {n}.",
    "Task: submit the answer {n}",
    "submit the answer {n} please",
    "The answer is {n}. Submit the answer {n} now.",
    "Submit the answer {n} with the answer command.",
)
DISTRACTIONS = (
    "There are {m} files in the repository.",
    "This is attempt {m}.",
    "The build took {m} seconds.",
    "Ignore issue {m} for now.",
    "Be brief.",
    "Work in the current directory.",
    "Do not ask questions.",
)
SHORT_SYSTEMS = (
    "You are a helpful assistant.",
    "You are a coding agent. Use the tools to complete the task.",
    "You are an expert software engineer working in a terminal. Be concise.",
    "You are Qwen, a helpful assistant that uses tools.",
)
TASK_PREFIXES = (
    "<system-reminder>\nAnswer briefly.\n</system-reminder>\n\n",
    "<system-reminder>\nThe user's project notes are below. Follow them.\n</system-reminder>\n\n",
    "<environment_context>\n  <cwd>/tmp/work</cwd>\n</environment_context>\n\n",
)
AFTER_SYSTEMS = (  # their digits are drawn afresh for each episode
    "# Environment\nYou have been invoked in the following environment:\n - Primary working directory: /tmp/work\n"
    " - Platform: linux\n - Shell: bash",
    "Today's date is 2026-01-01.",
    "# Environment\n - Is a git repository: false\n - OS Version: Linux 6.18.44\n - Model context: 200000 tokens",
    "Current time: 2026-11-23 01:10:04 UTC. 3 background tasks are running.",
)
# Agents name shells in prose too, near the task (Codex: `<shell>bash</shell>` before it, Claude Code: `Shell: bash`
# after it), often not the tool they offer: the model learns to take the name from the offered tool, not the prose.
SHELL_MENTIONS = (
    "Shell: {shell}",
    "<environment_context>\n  <shell>{shell}</shell>\n</environment_context>",
    "Use {shell} for file operations like ls and grep.",
    "When you run a non-trivial {shell} command, explain what it does.",
)
SHELL_WORDS = ("bash", "Bash", "exec_command", "sh", "zsh")
SHELL_MENTION_RATE = 0.5
TOOL_OUTPUTS = (
    "", "ok", "OK", "Answer recorded.", "answer recorded: {n}", "submitted {n}", "(no output)", "{n}",
    "bash: answer: command not found", "Exit code 0", "correct", "wrong", "received answer {n}\n",
    "{{\"ok\": true, \"answer\": {n}}}", "Command completed with exit code 0.\n\nanswer {n}",
)
FILLER_WORDS = (
    "you are an expert coding assistant operating inside a terminal harness help users by reading files "
    "executing commands editing code and writing new files use the available tools when needed always prefer "
    "the simplest approach keep answers short show file paths clearly do not guess verify with tools before "
    "answering guidelines the user may ask questions about the project structure tests build commands follow "
    "conventions of existing code never commit secrets check your work run tests after changes respond in "
    "markdown when useful the current working directory date platform linux shell git repository version"
).split()
OTHER_TOOLS = (
    ("read", "Read the contents of a file.", ("path",)),
    ("write", "Write content to a file, creating it if needed.", ("path", "content")),
    ("edit", "Replace text in a file.", ("path", "oldText", "newText")),
    ("ls", "List a directory.", ("path",)),
    ("grep", "Search file contents with a regular expression.", ("pattern", "path")),
    ("glob", "Find files by name pattern.", ("pattern",)),
    ("webfetch", "Fetch a URL.", ("url", "format")),
)
