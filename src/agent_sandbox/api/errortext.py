"""How an exception reads in a log line or an error message: its type, its message, never an empty string.

`str(exc)` alone loses what failed: `str(TimeoutError())` and `str(asyncio.CancelledError())` are empty, and
`str(KeyError("x"))` is just `'x'`. A log such as `failed to renew lease ns/name: ` (the empty text that hid
a renewal timeout, issue 11) is what that produces. Every site that formats an exception for a human
(logs, wrapped error messages) goes through `describe_error` instead.

It lives in `api` because that is the one package every layer may import (runtime included); it is pure
string formatting with no I/O. Condition messages that must match upstream's wording (the server's Status
message, as Go's `StatusError.Error()` prints it) are a different thing and keep their own formatting.
"""

from __future__ import annotations

__all__ = ["describe_error"]


def _is_timeout(exc: BaseException) -> bool:
    # TimeoutError covers asyncio.timeout/wait_for and aiohttp's ServerTimeoutError; the name check covers
    # timeout classes that do not derive from it (agent_sandbox.kube.errors.Timeout, socket.timeout aliases).
    return isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__


def describe_error(exc: BaseException) -> str:
    """`"<Type>: <message>"` for `exc`, never empty, and a timeout always says "timed out".

    - The type name is always there (`ServerError: 500 InternalError: etcd down`, `KeyError: 'x'`).
    - An empty message is replaced: by "timed out" for a timeout, else by the cause it was raised from
      (`raise X from cause`, or the exception being handled when it was raised), else left out (`ValueError`).
    - A timeout whose message does not mention it gets "(timed out)" appended.

    Example: `describe_error(TimeoutError())` is `"TimeoutError: timed out"`.
    """
    return _describe(exc, {id(exc)})


def _describe(exc: BaseException, seen: set[int]) -> str:
    name = type(exc).__name__
    try:
        text = str(exc).strip()
    except Exception:  # a broken __str__ must not break the log line that reports the error
        text = "<unprintable message>"
    timeout = _is_timeout(exc)
    if not text and timeout:
        text = "timed out"
    elif not text:
        cause = exc.__cause__
        if cause is None and not exc.__suppress_context__:
            cause = exc.__context__
        if cause is not None and id(cause) not in seen:  # chains can loop; follow each link once
            seen.add(id(cause))
            text = f"caused by {_describe(cause, seen)}"
    elif timeout and "time" not in text.lower():
        text = f"{text} (timed out)"
    return f"{name}: {text}" if text else name
