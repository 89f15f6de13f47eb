"""Label selectors evaluated in memory (caches, the fake client), with the API server's string syntax.

Supports `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists) and `!k` (does not exist),
comma-separated (AND). Parsed selectors are memoised because controllers reuse a handful of them.
Failure mode: a malformed selector raises `ValueError` naming it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping

from ._types import LabelSelector

__all__ = ["compile_selector", "matches"]

Matcher = Callable[[Mapping[str, str]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([^\s!=,()]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=,()]+)\s*(==|=|!=)\s*([^\s!=,()]*)\s*$")


def _split(selector: str) -> list[str]:
    # Commas inside "in (a,b)" do not separate requirements.
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def _requirement(text: str) -> Matcher:
    if m := _EQ_RE.match(text):
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _SET_RE.match(text):
        neg, key, op, values = m.groups()
        if op is None:
            if neg:
                return lambda labels: key not in labels
            return lambda labels: key in labels
        if neg:
            raise ValueError(f"invalid label selector requirement {text!r}")
        vals = frozenset(v.strip() for v in values.split(",") if v.strip())
        if op == "in":
            return lambda labels: labels.get(key) in vals
        return lambda labels: labels.get(key) not in vals
    raise ValueError(f"invalid label selector requirement {text!r}")


@functools.lru_cache(maxsize=256)
def _compile_str(selector: str) -> Matcher:
    reqs = [_requirement(part) for part in _split(selector)]
    if not reqs:
        return lambda labels: True
    if len(reqs) == 1:
        return reqs[0]
    return lambda labels: all(r(labels) for r in reqs)


def compile_selector(selector: LabelSelector | None) -> Matcher:
    """Compile a selector (string or equality map; None/"" match everything) into a predicate on labels."""
    if selector is None:
        return lambda labels: True
    if isinstance(selector, str):
        return _compile_str(selector)
    items = tuple(selector.items())
    return lambda labels: all(labels.get(k) == v for k, v in items)


def matches(selector: LabelSelector | None, labels: Mapping[str, str] | None) -> bool:
    """Whether `labels` (None = no labels) satisfy `selector`."""
    return compile_selector(selector)(labels or {})
