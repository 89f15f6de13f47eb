"""Kubernetes timestamps read as the apiserver admits them (`format: date-time`), and deadlines after them.

The SDK's own copy of the control plane's `agent_sandbox.api.meta.parse_time` and `deadline_after`; expiry
(`_expiry.py`) is reckoned with them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = ["deadline_after", "parse_time"]


# kube-apiserver's `format: date-time` check (k8s.io/kube-openapi strfmt `IsDateTime`), as the control plane's
# `agent_sandbox.api.meta.parse_time` reads it (this SDK installs alone; tests keep the two in step): the value
# split at every "t"/"T", a `2006-01-02` date, then this with hour <= 23, minute/second <= 59, where the
# unescaped "." admits any one character before the fraction and the offset any two-digit hh:mm ("+24:00").
_APISERVER_TIME_RE = re.compile(
    r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?([zZ]|([+-])([0-9]{2}):([0-9]{2}))\Z"
)
_APISERVER_DATE_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\Z")
_CANONICAL_TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z\Z")
_UTC_MIN = datetime.min.replace(tzinfo=UTC)
_UTC_MAX = datetime.max.replace(tzinfo=UTC)


def _parse_apiserver_time(value: str) -> datetime | None:
    pieces = re.split("[tT]", value)
    if len(pieces) < 2:
        return None
    date, clock = _APISERVER_DATE_RE.match(pieces[0]), _APISERVER_TIME_RE.match(pieces[1])
    if date is None or clock is None:
        return None
    year, month, day = (int(g) for g in date.groups())
    hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3])
    if hour > 23 or minute > 59 or second > 59:
        return None
    try:  # Go's calendar check; year 0000 (a leap year) has 2000's month lengths
        datetime(year or 2000, month, day)
    except ValueError:
        return None
    if year == 0:
        return _UTC_MIN
    micros = int(clock[4][1:7].ljust(6, "0")) if clock[4] else 0
    local = datetime(year, month, day, hour, minute, second, micros, tzinfo=UTC)
    offset = 0 if clock[5] in "zZ" else int(clock[7]) * 60 + int(clock[8])
    try:
        return local - timedelta(minutes=offset if clock[6] != "-" else -offset)
    except OverflowError:  # past years 1-9999: clamped, comparisons with a real `now` stay right
        return _UTC_MIN if clock[6] != "-" else _UTC_MAX


def parse_time(value: object) -> datetime | None:
    """Every value the apiserver admits as `format: date-time` (above), else what `fromisoformat` reads."""
    if not isinstance(value, str) or not value:
        return None
    if _CANONICAL_TIME_RE.match(value):
        # Fast path (~0.4 us instead of ~4 us) for the form the apiserver writes; for this shape
        # `fromisoformat` reads exactly what the check admits (year 0000 aside: refused, the slow path clamps it).
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    admitted = _parse_apiserver_time(value)
    if admitted is not None:
        return admitted
    text = value.strip().replace("z", "Z")
    if "." in text:  # Python parses at most 6 fractional digits; Go writes up to 9.
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def deadline_after(start: datetime, seconds: float) -> datetime | None:
    """`start` + `seconds`, or None ("never") past `datetime.max` (a TTL above int32: the apiserver does not
    range-check the CRD's int32); as the control plane's `agent_sandbox.api.meta.deadline_after`."""
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:
        return None if seconds > 0 else _UTC_MIN
