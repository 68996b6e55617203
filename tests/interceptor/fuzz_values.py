"""Values for fuzzing the interception server: JSON of the wrong type or size, bodies that are not JSON, and
Authorization and other headers of every kind, each under a label that names it. Generators draw through a
`Source`, so the same tables serve Hypothesis (which then shrinks) and a seeded `random.Random`.
"""

from __future__ import annotations

import functools
import gzip
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import orjson

__all__ = [
    "AUTHORIZATIONS",
    "AUTH_VARIANTS",
    "Credentials",
    "DEPTHS",
    "HEADERS",
    "HTTP_LAYER_AUTH",
    "PART_TYPES",
    "PART_TYPE_LABELS",
    "RAW_BODIES",
    "RAW_LABELS",
    "RandomSource",
    "Raw",
    "Source",
    "deep_list",
    "deep_object",
    "deep_schema",
    "encode",
    "junk",
]

T = TypeVar("T")


class Source(Protocol):
    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, low: int, high: int) -> int: ...


class RandomSource:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choice(self, options: Sequence[T]) -> T:
        return self._rng.choice(options)

    def integer(self, low: int, high: int) -> int:
        return self._rng.randint(low, high)


# ------------------------------------------------------------------------------------------------- JSON values


class Raw(str):
    """JSON text spliced into a body as is: nesting deeper than encoders allow, numbers no Python type holds."""


def encode(value: object) -> bytes:
    if isinstance(value, Raw):
        return value.encode()
    if isinstance(value, dict):
        return b"{" + b",".join(orjson.dumps(str(k)) + b":" + encode(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(encode(v) for v in value) + b"]"
    return orjson.dumps(value)


def deep_list(depth: int) -> Raw:
    return Raw("[" * depth + "1" + "]" * depth)


def deep_object(depth: int) -> Raw:
    return Raw('{"a":' * depth + "1" + "}" * depth)


def deep_schema(depth: int) -> Raw:
    return Raw('{"type":"object","properties":{"x":' * depth + '{"type":"string"}' + "}}" * depth)


# orjson reads 1024 levels and writes 255; Python's json and jinja recurse about 1000 deep.
DEPTHS = (64, 253, 254, 255, 256, 300, 600, 1100)

# Values of the wrong type or an awkward size, by label. Each factory may draw (a depth, a length).
_JUNK: dict[str, Callable[[Source], object]] = {
    "null": lambda s: None,
    "true": lambda s: True,
    "false": lambda s: False,
    "zero": lambda s: 0,
    "int": lambda s: s.choice((1, 2, 7, 100, 4096)),
    "negative": lambda s: s.choice((-1, -100, -(2**63))),
    "int64_max": lambda s: 2**63 - 1,
    "uint64_max": lambda s: 2**64 - 1,
    "huge_int": lambda s: Raw("1" + "0" * 30),  # orjson reads it as a float
    "float": lambda s: s.choice((0.5, 1.5, -0.0, 3.7)),
    "tiny_float": lambda s: 5e-324,
    "big_float": lambda s: 1.7e308,
    "string": lambda s: s.choice(("abc", "user", "function", "auto", "none")),
    "numeric_string": lambda s: s.choice(("12", "0.5", "-1", "1e3")),
    "empty_string": lambda s: "",
    "unicode": lambda s: "é✓数 \u202e\U0001f600",
    "nul_char": lambda s: "a\u0000b",
    "special_tokens": lambda s: "<|im_end|>\n<|im_start|>assistant\n<tool_call>",
    "long_string": lambda s: "word " * s.choice((2_000, 20_000)),
    "empty_list": lambda s: [],
    "list": lambda s: [1, "a", None, {"b": []}],
    "list_of_strings": lambda s: ["a", "b"],
    "empty_object": lambda s: {},
    "object": lambda s: {"a": {"b": [1, 2]}, "c": "d"},
    "deep_list": lambda s: deep_list(s.choice(DEPTHS)),
    "deep_object": lambda s: deep_object(s.choice(DEPTHS)),
}
_JUNK_LABELS = tuple(_JUNK)


def junk(src: Source) -> tuple[str, object]:
    label = src.choice(_JUNK_LABELS)
    value = _JUNK[label](src)
    if isinstance(value, Raw) and label.startswith("deep"):
        label += str(value.count("[") or value.count("{"))
    return label, value


# Bodies that are not a JSON object, or not JSON, or not UTF-8.
_GOOD_JSON = b'{"messages": [{"role": "user", "content": "hi"}]}'
RAW_BODIES: dict[str, bytes] = {
    "empty": b"",
    "whitespace": b" \r\n\t",
    "truncated": b'{"messages": [{"role": "us',
    "not_json": b"{not json",
    "array": b"[1, 2]",
    "string": b'"hi"',
    "number": b"42",
    "null": b"null",
    "invalid_utf8": b'{"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}',
    "invalid_utf8_key": b'{"\xc3\x28": 1, "messages": []}',
    "latin1": '{"messages": [{"role": "user", "content": "café"}]}'.encode("latin-1"),
    "utf16": _GOOD_JSON.decode().encode("utf-16"),
    "bom": b"\xef\xbb\xbf" + _GOOD_JSON,
    "lone_surrogate": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    "raw_nul": b'{"messages": [{"role": "user", "content": "a\x00b"}]}',
    "trailing_garbage": _GOOD_JSON + b"}]",
    "duplicate_keys": b'{"messages": 1, "messages": [{"role": "user", "content": "hi"}]}',
    "nan": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    "infinite_number": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e999}',
    "deep_array": b"[" * 100_000 + b"]" * 100_000,
    "deep_object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "deep_array_1023": b"[" * 1023 + b"]" * 1023,
}
RAW_LABELS = tuple(RAW_BODIES)


# ------------------------------------------------------------------------------------------------- headers


@dataclass(frozen=True, slots=True)
class Credentials:
    rollout_id: str
    secret: str
    tools_secret: str
    admin_token: str


# How each kind of Authorization header is made from the scenario's credentials (None: no header).
AUTHORIZATIONS: dict[str, Callable[[Credentials], bytes | None]] = {
    "secret": lambda c: b"Bearer " + c.secret.encode(),
    "tools_secret": lambda c: b"Bearer " + c.tools_secret.encode(),
    "admin": lambda c: b"Bearer " + c.admin_token.encode(),
    "none": lambda c: None,
    "empty": lambda c: b"",
    "bearer_only": lambda c: b"Bearer ",
    "wrong_scheme": lambda c: b"Basic " + c.secret.encode(),
    "no_scheme": lambda c: c.secret.encode(),
    "lowercase_scheme": lambda c: b"bearer " + c.secret.encode(),
    "other_secret": lambda c: b"Bearer sk-not-this-rollouts-secret",
    "utf8_non_ascii": lambda c: "Bearer sécret✓数".encode(),
    "latin1_bytes": lambda c: b"Bearer s\xe9cret",  # not UTF-8: aiohttp hands the app surrogate escapes
    "secret_with_latin1_tail": lambda c: b"Bearer " + c.secret.encode() + b"\xe9",
    "admin_with_latin1_tail": lambda c: b"Bearer " + c.admin_token.encode() + b"\xff",
    "tab_inside": lambda c: b"Bearer\t" + c.secret.encode(),
    "long": lambda c: b"Bearer " + b"x" * 6000,
    # aiohttp's parser refuses these before the app sees them (bench only: `http_layer`)
    "control_bytes": lambda c: b"Bearer \x01\x7f",
    "too_long": lambda c: b"Bearer " + b"x" * 9000,
}
HTTP_LAYER_AUTH = ("control_bytes", "too_long")
AUTH_VARIANTS = tuple(k for k in AUTHORIZATIONS if k not in HTTP_LAYER_AUTH)

# Request headers that change how the body is read: (valid JSON body) -> (body to send, headers).
HEADERS: dict[str, Callable[[bytes], tuple[bytes, tuple[tuple[str, bytes], ...]]]] = {
    "gzip_valid": lambda b: (gzip.compress(b), (("Content-Encoding", b"gzip"),)),
    "gzip_not_gzip": lambda b: (b, (("Content-Encoding", b"gzip"),)),
    "gzip_truncated": lambda b: (gzip.compress(b)[:-6], (("Content-Encoding", b"gzip"),)),
    "deflate_junk": lambda b: (b"\x78\x9c" + b, (("Content-Encoding", b"deflate"),)),
    "br_junk": lambda b: (b, (("Content-Encoding", b"br"),)),
    "unknown_encoding": lambda b: (b, (("Content-Encoding", b"x-fancy"),)),
    "gzip_bomb": lambda b: (_gzip_bomb(), (("Content-Encoding", b"gzip"),)),
    "gzip_empty": lambda b: (b"", (("Content-Encoding", b"gzip"),)),
    "gzip_then_br": lambda b: (gzip.compress(b), (("Content-Encoding", b"gzip, br"),)),
    "deflate_valid": lambda b: (zlib.compress(b), (("Content-Encoding", b"deflate"),)),
    "identity": lambda b: (b, (("Content-Encoding", b"identity"),)),
    "zstd": lambda b: (b, (("Content-Encoding", b"zstd"),)),
    "encoding_not_ascii": lambda b: (b, (("Content-Encoding", "gzïp".encode()),)),
    "text_plain": lambda b: (b, (("Content-Type", b"text/plain"),)),
    "form": lambda b: (b, (("Content-Type", b"application/x-www-form-urlencoded"),)),
    "charset_latin1": lambda b: (b, (("Content-Type", b"application/json; charset=latin-1"),)),
    "expect_continue": lambda b: (b, (("Expect", b"100-continue"),)),
    "duplicate_authorization": lambda b: (b, (("Authorization", b"Bearer second"),)),
}

# `type` values for content parts and blocks that name nothing the dialect knows: JSON of every other kind (a list or
# an object once made the Responses dialect answer 500: it looked the type up in a set) and other dialects' names.
PART_TYPES: dict[str, object] = {
    "empty_list": [],
    "list_of_a_name": ["text"],
    "nested_list": [[]],
    "empty_object": {},
    "object_with_a_type": {"type": "text"},
    "null": None,
    "true": True,
    "zero": 0,
    "float": 1.5,
    "empty_string": "",
    "chat_name": "image_url",
    "messages_name": "tool_result",
    "responses_name": "output_text",
}
PART_TYPE_LABELS = tuple(PART_TYPES)


@functools.cache
def _gzip_bomb() -> bytes:
    """32 KiB that inflate to 32 MiB, past the server's body limit."""
    return gzip.compress(b"[" + b" " * (32 * 1024 * 1024) + b"]", compresslevel=6)
