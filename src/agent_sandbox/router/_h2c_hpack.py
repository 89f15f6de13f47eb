"""The HPACK encoder of the h2c pass-through (`_h2c`): header blocks re-encoded for the sandbox with no dynamic table.

A unit of its own because its whole point is what it does not do: it indexes nothing, so the sandbox's
decoder keeps no state the router must follow (docs/design/router-h2c-hpack.md), and one encoder serves
every connection.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["_StaticEncoder", "_encoder"]

_TABLE_SIZE_ZERO = b"\x20"
"""HPACK dynamic table size update to 0 (RFC 7541 6.3), at the start of every re-encoded block: a decoder
whose SETTINGS_HEADER_TABLE_SIZE went below its current table size expects one (nghttp2 and hpack refuse the
block otherwise), and 0 is within any setting."""


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) in a `prefix_bits` prefix, the octet's other bits from `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _StaticEncoder:
    """HPACK encoding without the dynamic table: a field the static table holds whole is indexed, every other
    one is a literal without indexing (RFC 7541 6.2.2; never indexed, 6.2.3, when the client marked it so),
    its name indexed when the static table has it; no Huffman coding.

    Nothing is indexed, so the sandbox's decoder keeps no state the router must follow (docs/design/
    router-h2c-hpack.md). Not `hpack.Encoder`: with a zero-size table it cost 80 us a gRPC request block, nearly
    all Huffman coding; this costs a few (a block is ~30% larger, on the pod network).
    """

    def __init__(self) -> None:
        from hpack import NeverIndexedHeaderTuple
        from hpack.table import HeaderTable

        self._never = NeverIndexedHeaderTuple
        self._fields: dict[tuple[bytes, bytes], bytes] = {}
        """(name, value) -> its indexed representation, for the static table's fields."""
        self._plain: dict[bytes, bytes] = {}
        """name -> the start of a literal without indexing naming it (by static index, else literally)."""
        self._sensitive: dict[bytes, bytes] = {}
        """name -> the same for a never-indexed literal."""
        for index, (name, value) in enumerate(HeaderTable.STATIC_TABLE, 1):
            self._fields.setdefault((name, value), _hpack_int(index, 7, 0x80))
            self._plain.setdefault(name, _hpack_int(index, 4, 0x00))
            self._sensitive.setdefault(name, _hpack_int(index, 4, 0x10))
        self._static_names = len(self._plain)

    def _literal_name(self, name: bytes, names: dict[bytes, bytes], flag: int) -> bytes:
        prefix = bytes((flag,)) + _hpack_int(len(name), 7, 0) + name
        # Metadata names repeat, so they are kept; bounded in number and length all the same: the encoder is
        # shared by every connection, any client (before its credential is checked) picks the names, and one
        # may be as long as a header list (1,024 names of 4 KB held ~8 MB for good until December 6).
        if len(name) <= 128 and len(names) < self._static_names + 1024:
            names[name] = prefix
        return prefix

    def encode(self, headers: list[Any]) -> bytes:
        """A header block: a table size update to 0, then `headers` (bytes pairs, as `hpack` decodes them)."""
        out = [_TABLE_SIZE_ZERO]
        fields, plain, sensitive, never = self._fields, self._plain, self._sensitive, self._never
        for field in headers:
            name, value = field[0], field[1]
            if type(field) is never:
                prefix = sensitive.get(name) or self._literal_name(name, sensitive, 0x10)
            else:
                indexed = fields.get((name, value))
                if indexed is not None:
                    out.append(indexed)
                    continue
                prefix = plain.get(name) or self._literal_name(name, plain, 0x00)
            size = len(value)
            out += (prefix, bytes((size,)) if size < 0x7F else _hpack_int(size, 7, 0), value)
        return b"".join(out)


@functools.cache
def _encoder() -> _StaticEncoder:
    """The one encoder (it has no state: any connection may use it)."""
    return _StaticEncoder()
