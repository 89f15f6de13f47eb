"""The name hash and the label selectors built from it (api spec §7.5, controllers spec §0.2).

`name_hash` is the value of the `sandbox-name-hash`, `warm-pool-sandbox` and `sandbox-template-ref-hash`
labels; it must match upstream bit for bit (test vectors below). Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .constants import LABEL_SANDBOX_NAME_HASH, LABEL_WARM_POOL_SANDBOX

__all__ = [
    "NAME_HASH_TEST_VECTORS",
    "fnv1a_32",
    "name_hash",
    "sandbox_selector",
    "template_ref_hash",
    "warm_pool_selector",
]

_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193

#: Known-good vectors from the upstream spec; asserted by the unit tests.
NAME_HASH_TEST_VECTORS: Final[Mapping[str, str]] = {
    "": "811c9dc5",
    "a": "e40c292c",
    "pool": "91dd7983",
    "my-sandbox": "374de8f5",
    "sandbox-name": "ab179450",
    "test-template": "69155462",
}


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a of `data`."""
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def name_hash(name: str) -> str:
    """`NameHash`: FNV-1a 32 of the UTF-8 bytes, as 8 lowercase zero-padded hex digits."""
    return f"{fnv1a_32(name.encode('utf-8')):08x}"


def template_ref_hash(template_name: str) -> str:
    """`SandboxTemplateRefHash(name)` = `NameHash(name)`: the `sandbox-template-ref-hash` label value."""
    return name_hash(template_name)


def sandbox_selector(sandbox_name: str) -> str:
    """Sandbox `status.selector`: `agents.x-k8s.io/sandbox-name-hash=<hash>`."""
    return f"{LABEL_SANDBOX_NAME_HASH}={name_hash(sandbox_name)}"


def warm_pool_selector(pool_name: str) -> str:
    """SandboxWarmPool `status.selector`: `agents.x-k8s.io/warm-pool-sandbox=<hash>`."""
    return f"{LABEL_WARM_POOL_SANDBOX}={name_hash(pool_name)}"
