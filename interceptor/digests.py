"""Content digests: XXH3-128 seeded afresh per process.

What the server compares but need not keep (a body's prefix, a tool list) is kept as a 16-byte digest. XXH3 hashes
40+ GB/s, so a digest of a long history costs microseconds; the 128-bit value makes an accidental collision
negligible (2^-128 per comparison), and the secret per-process seed means no request can be crafted to collide
with another's.
"""

from __future__ import annotations

import secrets

import xxhash

__all__ = ["digest", "hasher"]

_SEED = secrets.randbits(64)


def digest(data: bytes | memoryview) -> bytes:
    return xxhash.xxh3_128_digest(data, seed=_SEED)


def hasher() -> xxhash.xxh3_128:
    """An incremental digest: `update` it with pieces, `digest()` at any point; equals `digest` of their join."""
    return xxhash.xxh3_128(seed=_SEED)
