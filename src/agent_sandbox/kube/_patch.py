"""Pure patch helpers: build a JSON merge patch from two objects, and apply merge / JSON patches.

Owns the controllers-spec §0.5 convention "status and metadata writes are JSON merge patches computed as
the diff between the old and new object; lists are replaced wholesale; removed fields are sent as null",
plus RFC 7386 / RFC 6902 application (used by the fake client). No I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["apply_json_patch", "apply_merge_patch", "create_merge_patch"]


def create_merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 patch that turns `old` into `new` (empty dict when they are equal)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, new_value in new.items():
        old_value = old.get(key, _MISSING)
        if old_value is _MISSING:
            patch[key] = new_value
        elif isinstance(old_value, Mapping) and isinstance(new_value, Mapping):
            sub = create_merge_patch(old_value, new_value)
            if sub:
                patch[key] = sub
        elif old_value != new_value:
            patch[key] = new_value
    return patch


_MISSING = object()


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch; returns a new value (inputs are not mutated)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str]) -> tuple[Any, str]:
    node = doc
    for tok in tokens[:-1]:
        node = node[int(tok)] if isinstance(node, list) else node[tok]
    return node, tokens[-1]


def _get(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for tok in tokens:
        node = node[int(tok)] if isinstance(node, list) else node[tok]
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens)
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    parent, last = _parent(doc, tokens)
    if isinstance(parent, list):
        return parent.pop(int(last))
    return parent.pop(last)


def apply_json_patch(target: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """Apply an RFC 6902 JSON patch; returns a new document.

    Raises:
        ValueError: an operation failed (missing path, failed `test`, unknown op).
    """
    doc = copy.deepcopy(target)
    for op in ops:
        name, tokens = op.get("op"), _pointer(op.get("path", ""))
        try:
            if name == "add":
                doc = _add(doc, tokens, copy.deepcopy(op["value"]))
            elif name == "remove":
                _remove(doc, tokens)
            elif name == "replace":
                _get(doc, tokens)  # must exist
                if not tokens:
                    doc = copy.deepcopy(op["value"])
                else:
                    parent, last = _parent(doc, tokens)
                    parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
            elif name == "test":
                if _get(doc, tokens) != op["value"]:
                    raise ValueError(f"test failed at {op['path']}")
            elif name in ("move", "copy"):
                src = _pointer(op["from"])
                value = _get(doc, src)
                if name == "move":
                    _remove(doc, src)
                doc = _add(doc, tokens, copy.deepcopy(value))
            else:
                raise ValueError(f"unknown JSON patch op {name!r}")
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"JSON patch op {name} {op.get('path')!r} failed: {exc!r}") from exc
    return doc
