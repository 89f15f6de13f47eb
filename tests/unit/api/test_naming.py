"""The name hash and its selectors (api spec §7.5)."""

from __future__ import annotations

import pytest

from agent_sandbox.api import naming

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("name", "expected"), sorted(naming.NAME_HASH_TEST_VECTORS.items()))
def test_name_hash_vectors(name: str, expected: str) -> None:
    assert naming.name_hash(name) == expected


def test_name_hash_is_utf8_and_zero_padded() -> None:
    # FNV-1a over UTF-8 bytes, not code points: a non-ASCII name hashes its 2-byte encoding.
    utf8, latin1 = "é".encode(), "é".encode("latin-1")
    assert utf8 == b"\xc3\xa9"
    assert naming.name_hash("é") == format(naming.fnv1a_32(utf8), "08x")
    assert naming.name_hash("é") != format(naming.fnv1a_32(latin1), "08x")
    for name in ("x", "sandbox-1", "a" * 300):
        digest = naming.name_hash(name)
        assert len(digest) == 8
        assert digest == digest.lower()
        int(digest, 16)


def test_selectors() -> None:
    assert naming.sandbox_selector("my-sandbox") == "agents.x-k8s.io/sandbox-name-hash=374de8f5"
    assert naming.warm_pool_selector("pool") == "agents.x-k8s.io/warm-pool-sandbox=91dd7983"
