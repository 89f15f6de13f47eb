"""One HTTP call to a sandbox: target resolution, headers, the retry policy and status checking (spec §3.8).

Retry policy (both drivers, one implementation):
- a request that certainly never reached the server (connect failure) is retried whatever the method;
- GET/HEAD/PUT/DELETE are also retried on a dropped connection and on 500/502/503/504;
- POST (execute, upload) is never retried once sent; timeouts are never retried (the caller's budget is spent),
  nor is a call the client's own `close()` cut (`SandboxClientClosedError`);
- up to 5 retries, waiting 0.5 * 2^attempt s, as upstream. After the last try a 5xx is returned to the
  status check (so it raises `SandboxRequestError` with that status), not a "retries exhausted" error;
- ours: after the first 502/503 the Sandbox is read once; when it no longer exists (deleted, or its claim
  expired) there is nothing to retry for, and the error says so at once (it took the 15.5 s of backoff):
  `SandboxDeletedError`, both a `SandboxNotFoundError` and a `SandboxRequestError`;
- ours: a POST answered 502 while its Sandbox exists and runs says it may have run (`may_have_run`);
- ours: a lifecycle router's 503 "Sandbox <ns>/<name> could not be resumed: <why>" is raised as it is, at
  once, whatever the method: neither read nor retried (the router said why, and its refusals are final);
- ours: a router's 504 saying the request's own `X-Sandbox-Timeout` ran out ("Timed out waiting for the
  backend sandbox: <id> (no response within <N> s: X-Sandbox-Timeout)") is the call's timeout:
  `SandboxRequestTimeoutError`, at once, whatever the method. Its other 504s (its own --proxy-timeout, its
  header timeout when the request set none) are retried as any 504.
After a 5xx or a transport failure the connection forgets its cached pod IP and tunnel.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import _kube
from ._authhint import AUTH_STATUSES, auth_hint
from ._checks import check_timeout
from ._claims import SandboxView
from ._connection import Connection, Target
from ._hibernation import archived, hibernated_hint
from ._lifecycle_names import REASON_SANDBOX_HIBERNATED
from ._steps import Flow, HttpRequest, HttpResponse, Open, ReadChunk, Send, Sleep, StreamHandle, Upload
from .constants import AUTO_RESUME_ANNOTATION
from .exceptions import (
    SandboxClientClosedError,
    SandboxDeletedError,
    SandboxRequestError,
    SandboxRequestTimeoutError,
)

__all__ = [
    "MAX_LIST_RESPONSE",
    "MAX_RETRIES",
    "MAX_RUN_RESPONSE",
    "call",
    "callers_timeout_ran_out",
    "check",
    "check_timeout",
    "error_detail",
    "explain_refusal",
    "explain_unreachable",
    "malformed_answer",
    "may_have_run",
    "open_stream",
    "stale_pod_ip",
]

MAX_RETRIES = 5
#: Largest `/execute` answer read (a runtime keeps 1 MiB of each stream by default); as the Go SDK.
MAX_RUN_RESPONSE = 16 << 20
#: Largest directory listing or `/exists` answer read; as the Go SDK. ~380,000 entries of the legacy runtime
#: (~90 bytes each; upstream's SDK has no limit, and 8 MiB refused a 100,000-file directory); parsed, ~0.5 GB
#: at most - the bound on what a hostile sandbox can make a client allocate.
MAX_LIST_RESPONSE = 32 << 20
#: Seconds before the first retry; doubles per attempt.
BACKOFF_BASE = 0.5
RETRY_STATUS = frozenset({500, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


#: Largest error body parsed as JSON for its message; a longer one (an HTML error page) is shown as text.
MAX_ERROR_JSON = 64 << 10


def _text_head(resp: HttpResponse, limit: int) -> str:
    """The start of the body as text, decoding only what is shown (an answer may be hundreds of MiB)."""
    return resp.content[: limit * 4].decode("utf-8", errors="replace").strip()[:limit]


def error_detail(resp: HttpResponse) -> str:
    """The human part of an error body: router `detail`, legacy `message`, sandboxd `code: message`."""
    if len(resp.content) > MAX_ERROR_JSON:
        return _text_head(resp, 300)
    try:
        body = resp.json()
    except ValueError:
        return _text_head(resp, 300)
    if isinstance(body, Mapping):
        if "code" in body and "message" in body:
            return f"{body['code']}: {body['message']}"
        if isinstance(detail := body.get("detail"), list):
            return _validation_errors(detail)[:300]
        for key in ("detail", "message", "error"):
            if key in body:
                return str(body[key])[:300]
    return _text_head(resp, 300)


def _validation_errors(errors: list[Any]) -> str:
    """A FastAPI-style 422 `detail` list (upstream's runtime; ours answers the same): `field: message; ...`."""
    parts = []
    for error in errors:
        if isinstance(error, Mapping):
            loc = error.get("loc")
            where = ".".join(str(p) for p in loc if p != "body") if isinstance(loc, list) else ""
            parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        else:
            parts.append(str(error))
    return "; ".join(parts)


#: What reading a malformed answer can raise: JSON of the wrong shape or type, values out of range.
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError, OSError)


@contextmanager
def malformed_answer(what: str, resp: HttpResponse | None = None, sample: object = None) -> Iterator[None]:
    """Turn an error while reading a sandbox's answer into `SandboxRequestError` naming `what`.

    What a sandbox answers is untrusted (the code inside can replace the runtime server), so a caller that
    catches `SandboxError` must not meet a `KeyError` or a pydantic error from parsing it.
    """
    try:
        yield
    except SandboxRequestError:
        raise
    except _MALFORMED as err:
        shown = _text_head(resp, 200) if resp is not None else str(sample)[:200]
        raise SandboxRequestError(
            f"{what}: malformed answer from the sandbox ({type(err).__name__}: {err}): {shown!r}",
            resp.status_code if resp is not None else None,
            resp,
        ) from err


def _where(resp: HttpResponse) -> str:
    """`METHOD URL` for a message; a URL past 300 characters (a deep path, percent-encoded) is cut."""
    url = resp.url if len(resp.url) <= 300 else f"{resp.url[:200]}...{resp.url[-60:]}"
    return f"{resp.method} {url}"


#: How a router's 504 text starts (`router/_outcome.py` `timeout_error`), and how it ends when the limit that ran
#: out was the request's own `X-Sandbox-Timeout` - not capped by the router's --proxy-timeout, which ends
#: "..., capped by the router's --proxy-timeout)", nor the router's own limit ("... with X-Sandbox-Timeout)").
_ROUTER_TIMED_OUT = "Timed out waiting for the backend sandbox: "
_OWN_TIMEOUT_RAN_OUT = " s: X-Sandbox-Timeout)"


def callers_timeout_ran_out(resp: HttpResponse) -> bool:
    """A router's 504 for a request whose own `X-Sandbox-Timeout` (the call's timeout) ran out before the
    sandbox answered: the call timed out. Retrying it spends the caller's budget again (until December 7 a GET
    with `timeout=1` against a stuck runtime was sent six times and failed after 21.5 s with a plain HTTP 504)."""
    if resp.status_code != 504:
        return False
    detail = error_detail(resp)
    return detail.startswith(_ROUTER_TIMED_OUT) and detail.endswith(_OWN_TIMEOUT_RAN_OUT)


def check(resp: HttpResponse, *, allow: Collection[int] = ()) -> HttpResponse:
    """`resp` if it succeeded (or its status is in `allow`); else `SandboxRequestError` -
    `SandboxRequestTimeoutError` for a router's 504 saying the call's own timeout ran out."""
    code = resp.status_code
    if resp.over_limit:
        raise SandboxRequestError(
            f"{_where(resp)}: the answer is larger than {len(resp.content)} bytes", code, resp
        )
    if code in allow or 200 <= code < 300:
        return resp
    where = _where(resp)
    if 300 <= code < 400:
        raise SandboxRequestError(
            f"{where}: redirect {code} to {resp.headers.get('location', '?')} not followed", code, resp
        )
    detail = error_detail(resp)
    message = f"{where}: HTTP {code}" + (f": {detail}" if detail else "")
    if callers_timeout_ran_out(resp):
        raise SandboxRequestTimeoutError(message, code, resp)
    raise SandboxRequestError(message, code, resp)


#: The statuses of a router (or gateway) that could not reach the sandbox: worth saying why, if the API knows.
UNREACHABLE = frozenset({502, 503})


def stale_pod_ip(status: int, detail: str) -> bool:
    """The router refused the request, unforwarded, because the pod IP this handle sent is no longer its
    sandbox's (the Sandbox was deleted, or moved to a pod the router does not connect with the old address).
    The cached IP must be dropped; the request may be sent again, even a POST."""
    return status == 403 and detail.startswith("X-Sandbox-Pod-IP ") and "does not belong to sandbox" in detail


def _refused_for_stale_pod_ip(resp: HttpResponse) -> bool:
    # The status first: the body of a success can be a whole file, not worth decoding for an error message.
    return resp.status_code == 403 and stale_pod_ip(403, error_detail(resp))


def explain_refusal(
    conn: Connection, err: SandboxRequestError, headers: Mapping[str, str]
) -> SandboxRequestError:
    """`err` (a 401 or 403), with the reason when the request sent (`headers`) shows it (`_authhint`): the
    router's answers say only `unauthenticated`/`forbidden`. Same type, status and response."""
    status = err.status_code
    if status not in AUTH_STATUSES or (err.response is not None and _refused_for_stale_pod_ip(err.response)):
        return err
    hint = auth_hint(status, headers, conn.namespace, conn.sandbox_id)
    if hint is None:
        return err
    explained = SandboxRequestError(f"{err} - {hint}", status, err.response)
    explained.request_sent = err.request_sent
    return explained


#: What a lifecycle router's 503 says when it will not resume the Sandbox (`Sandbox <ns>/<name> could not be
#: resumed: <why>`, the router's module docstring): it said why, and the SDKs add no guess of their own.
RESUME_REFUSED = "could not be resumed"


def _resume_refused(resp: HttpResponse) -> bool:
    """A lifecycle router's 503 that says why it did not resume the Sandbox: raised as it is, not retried,
    and nothing read to explain it. Until December 6 a GET/HEAD/PUT/DELETE read the Sandbox and its archive
    and was retried, then said "restore it with the handle's resume()" of an archive the router had just said
    would never be restored (a POST, not retried, went to `explain_unreachable`, which knew the phrase)."""
    return resp.status_code == 503 and RESUME_REFUSED in error_detail(resp)


def explain_unreachable(
    conn: Connection, err: SandboxRequestError, unsent_body: str | None = None
) -> Flow[SandboxRequestError]:
    """`err` (the sandbox could not be reached), with the reason when its Sandbox object tells one: it is
    suspended (only a router running `--sandbox-lifecycle` resumes it, and only if it asks for auto-resume)
    or it no longer exists. One GET of the Sandbox (and, for a suspended one, at most one of its template), on
    this failure path only; when that fails too, `err` as it was. `unsent_body`: why a router could not hold
    the request's body to send it again (`_unsendable_body`), None when it could or there was none."""
    if err.response is not None and _resume_refused(err.response):  # said why, better than we could
        return err
    found, view = yield from _read_sandbox(conn)
    if not found:
        return err
    return (yield from _explained(conn, err, view, unsent_body))


def _read_sandbox(conn: Connection) -> Flow[tuple[bool, SandboxView | None]]:
    """(True, the Sandbox or None when it does not exist), or (False, None) when it could not be read.

    A hibernated Sandbox (ours: only its SandboxArchive exists) is a Suspended view with reason
    `SandboxHibernated`: until December 6 it was said to be deleted."""
    try:
        view = yield from conn.sandbox()
        if view is None and (yield from archived(conn.namespace, conn.sandbox_id)):
            view = SandboxView.of(
                {
                    "metadata": {"name": conn.sandbox_id},
                    "spec": {"operatingMode": "Suspended"},
                    "status": {
                        "conditions": [
                            {"type": "Ready", "status": "False", "reason": REASON_SANDBOX_HIBERNATED}
                        ]
                    },
                }
            )
    except Exception:  # a best-effort explanation (e.g. a client without Kubernetes access)
        return False, None
    return True, view


def _explained(
    conn: Connection, err: SandboxRequestError, view: SandboxView | None, unsent_body: str | None = None
) -> Flow[SandboxRequestError]:
    where = f"Sandbox {conn.namespace}/{conn.sandbox_id}"
    if view is None:
        why = f"the {where} no longer exists (deleted, or its claim expired)"
    elif view.reason == REASON_SANDBOX_HIBERNATED:
        why = "the " + hibernated_hint(conn.namespace, conn.sandbox_id)
    elif view.operating_mode == "Suspended":
        why = f"the {where} is suspended (spec.operatingMode: Suspended): " + (
            yield from _suspended_advice(conn, view, unsent_body)
        )
    else:
        return err
    explained = (
        # Gone: `SandboxNotFoundError` as the tree promises, and still the `SandboxRequestError` it was (until
        # December 7 only that: `except SandboxNotFoundError` never saw a deleted sandbox's calls fail).
        SandboxDeletedError(f"{err} - {why}", err.status_code, err.response)
        if view is None
        else SandboxRequestError(f"{err} - {why}", err.status_code, err.response)
    )
    explained.request_sent = err.request_sent  # a connect failure sent nothing: repeating it stays safe
    return explained


def may_have_run(method: str, err: SandboxRequestError) -> SandboxRequestError:
    """`err`, for a POST (commands.run/stream, files.write) answered 502 while its Sandbox exists and is not
    suspended (`explain_unreachable` found nothing to say), with what that can mean: a router's text is
    upstream's "Could not connect to the backend sandbox" for any failure of its exchange with the sandbox -
    also a runtime that died mid-command, which had started it. Until December 7 that was all that was said,
    which reads as if nothing ran, and a caller who ran it again ran it twice. Not retried (a POST never is
    once sent)."""
    if method in IDEMPOTENT or err.status_code != 502 or not err.request_sent:
        return err
    explained = SandboxRequestError(
        f"{err} - the request reached the router (or gateway), which may have passed it to the sandbox before "
        "the failure: the command may have started, or the write been (partly) done; it was not retried - "
        "check before calling again",
        err.status_code,
        err.response,
    )
    explained.request_sent = err.request_sent
    return explained


def _suspended_advice(conn: Connection, view: SandboxView, unsent_body: str | None = None) -> Flow[str]:
    """What to do about a suspended Sandbox, by its auto-resume setting (the Sandbox's own, else its template's).

    Resume on request takes both the Sandbox's opt-in and a router running `--sandbox-lifecycle`; which one is
    missing is said. Until December 6 the advice was always "run the router with --sandbox-lifecycle", also
    through a router that runs it, where the missing piece was the annotation.

    With the opt-in, what answered cannot be told from here: a router without the flag, or one with it that
    could not send this request again once the Sandbox was back (docs/lifecycle.md) - it holds a request and
    resends it whole to the resumed pod, but not one whose body was streamed or is over 64 KiB (`unsent_body`
    says which, when the SDK sent such a body), nor one that had reached the pod as it went (it may have run).
    Until December 7 this said "this request did not go through a router running --sandbox-lifecycle" also
    of a streamed `files.write` cut by a suspend through a router that runs it, where calling again succeeds."""
    advice = "resume it (the handle's resume(), `agent-sandbox resume`)"
    setting = yield from _auto_resume_setting(conn, view)
    if setting is None:
        template = (
            f"its SandboxTemplate {conn.namespace}/{view.template}"
            if view.template
            else "its SandboxTemplate"
        )
        return (
            f"{advice}, or, for resume on request, annotate the Sandbox or {template} with "
            f'{AUTO_RESUME_ANNOTATION}: "true" (served by a router running --sandbox-lifecycle)'
        )
    source, value = setting
    # The router's rule (`lifecycle_policy`): "true" or "false" in any case, nothing else - not even with a
    # space around it; any other value is a problem it reports, and resume on request is off. Until
    # December 6 "true " was taken as on here, and the advice blamed the router for what the value did.
    quoted = json.dumps(value, ensure_ascii=False)  # as it is: a stray space or newline shows
    if value.lower() == "true":
        asks = f"{advice}; it asks to be resumed on request ({AUTO_RESUME_ANNOTATION}: {quoted} on {source})"
        if unsent_body is not None:
            return (
                f"{asks}, and a router running --sandbox-lifecycle does so, but this request's body {unsent_body}, "
                "which a router cannot hold to send again once the Sandbox is back (only a body sent whole, up to "
                f"{_ROUTER_HOLDS >> 10} KiB with the request's head): calling again (with the content from its "
                "start) resumes the Sandbox and succeeds - unless this request did not go through a router "
                "running --sandbox-lifecycle"
            )
        return (
            f"{asks}, but this request did not go through a router running --sandbox-lifecycle, or it reached "
            "the Sandbox's pod as it was suspended and that router could not send it again (it may have run "
            "there): calling again then resumes the Sandbox"
        )
    if value.lower() == "false":
        return (
            f"{advice}; resume on request is off: {AUTO_RESUME_ANNOTATION}: {quoted} on {source} "
            '("true" turns it on, served by a router running --sandbox-lifecycle)'
        )
    return (
        f"{advice}; resume on request is off: {AUTO_RESUME_ANNOTATION}: {quoted} on {source} is not a valid "
        'value (want "true" or "false"; the router reads any other value as "false"): set it to "true" for '
        "resume on request, served by a router running --sandbox-lifecycle"
    )


def _auto_resume_setting(conn: Connection, view: SandboxView) -> Flow[tuple[str, str] | None]:
    """(where it is set, its value) of the `auto-resume` annotation that applies, as the router reads it: the
    Sandbox's own, else its SandboxTemplate's (one GET, on this failure path only); None when neither sets it
    or the template cannot be read (best effort, e.g. a role without `get sandboxtemplates`)."""
    if view.auto_resume is not None:
        return "the Sandbox", view.auto_resume
    if not view.template:
        return None
    try:
        template = yield from _kube.get(_kube.TEMPLATES, conn.namespace, view.template)
    except Exception:  # a best-effort explanation
        return None
    value = (((template or {}).get("metadata") or {}).get("annotations") or {}).get(AUTO_RESUME_ANNOTATION)
    if value is None:
        return None
    return f"its SandboxTemplate {conn.namespace}/{view.template}", str(value)


#: The most of a request (head and body, sent whole) a lifecycle router holds to send it again to a resumed
#: pod (`router/_exchange.py`'s `_REPLAY_LIMIT`; docs/lifecycle.md: "streamed or is over 64 KiB").
_ROUTER_HOLDS = 64 << 10


def _unsendable_body(req: HttpRequest) -> str | None:
    """Why a lifecycle router could not hold `req` to send it again once its Sandbox resumed, as the rest of
    "this request's body ..." (None: no body, or one small enough, sent whole). The head's size is estimated
    from what the SDK sets (the HTTP library adds a few short headers)."""
    if req.upload is not None:
        # an in-memory body over 1 MiB (`files.write`) is streamed with its length, said as its size
        length = next((v for k, v in req.headers.items() if k.lower() == "content-length"), None)
        return f"is {length} bytes" if length is not None and length.isdigit() else "was streamed"
    if req.content is not None:
        size = len(req.content)
    elif req.json is not None:
        size = len(json.dumps(req.json).encode())
    else:
        return None
    head = len(req.method) + len(req.url) + sum(len(k) + len(v) + 4 for k, v in req.headers.items()) + 128
    return f"is {size} bytes" if size + head > _ROUTER_HOLDS else None


def _request(
    target: Target,
    method: str,
    path: str,
    *,
    timeout: float | None,
    headers: Mapping[str, str] | None,
    **kw: Any,
) -> HttpRequest:
    return HttpRequest(
        method,
        target.base_url + path,
        headers=target.http_headers(dict(headers or {}), timeout),
        timeout=timeout,
        tls=target.tls,
        **kw,
    )


def call(
    conn: Connection,
    method: str,
    path: str,
    *,
    timeout: float | None,
    headers: Mapping[str, str] | None = None,
    allow: Collection[int] = (),
    json: Any = None,
    content: bytes | None = None,
    upload: Upload | None = None,
    params: Mapping[str, str] | None = None,
    max_response_bytes: int | None = None,
) -> Flow[HttpResponse]:
    """Send one request to the sandbox (retrying as the module docstring says) and check its status;
    an answer over `max_response_bytes` is a `SandboxRequestError` (the sandbox is untrusted)."""
    check_timeout(timeout)
    replayable = upload is None or upload.source.seekable()
    start = upload.source.tell() if upload is not None and replayable else 0
    attempt = 0
    refreshed = False
    # After the first "unreachable" answer the Sandbox is read once: deleted or suspended, no retry can help.
    settled = False
    view: SandboxView | None = None
    while True:
        target: Target = yield from conn.resolve()
        if upload is not None and (attempt or refreshed) and replayable:
            upload.source.seek(start)
        req = _request(
            target,
            method,
            path,
            timeout=timeout,
            headers=headers,
            json=json,
            content=content,
            upload=upload,
            params=params,
            max_response_bytes=max_response_bytes,
        )
        try:
            resp: HttpResponse = yield Send(req)
        except (SandboxRequestTimeoutError, SandboxClientClosedError):
            conn.failed()
            raise
        except SandboxRequestError as err:
            conn.failed()
            if attempt == 0 and not err.request_sent:
                # Nothing answered (a direct mode's pod IP or Service name): a suspended or deleted Sandbox
                # explains it, and no retry can help (in-cluster, a suspended one's Service name does not even
                # resolve: "Name or service not known" after 15 s of retries, until December 6).
                found, view = yield from _read_sandbox(conn)
                if found and (view is None or view.operating_mode == "Suspended"):
                    raise (yield from _explained(conn, err, view)) from None
            safe = not err.request_sent or method in IDEMPOTENT
            if attempt < MAX_RETRIES and safe and replayable:
                yield Sleep(BACKOFF_BASE * 2**attempt)
                attempt += 1
                continue
            raise
        if not refreshed and replayable and _refused_for_stale_pod_ip(resp):
            conn.failed()
            refreshed = True
            continue
        if resp.status_code >= 500:
            conn.failed()
            if (
                resp.status_code in RETRY_STATUS
                and method in IDEMPOTENT
                and attempt < MAX_RETRIES
                and replayable
                and not _resume_refused(resp)  # final: raised below as it is (`explain_unreachable`)
                and not callers_timeout_ran_out(resp)  # the call's timeout: raised below, by `check`
            ):
                if attempt == 0 and resp.status_code in UNREACHABLE:
                    found, view = yield from _read_sandbox(conn)
                    settled = found and (view is None or view.operating_mode == "Suspended")
                if not settled:
                    yield Sleep(BACKOFF_BASE * 2**attempt)
                    attempt += 1
                    continue
        try:
            return check(resp, allow=allow)
        except SandboxRequestError as err:
            if resp.status_code in AUTH_STATUSES:
                raise explain_refusal(conn, err, req.headers) from None
            if resp.status_code not in UNREACHABLE:
                raise
            unsent = _unsendable_body(req)
            if settled:
                raise (yield from _explained(conn, err, view, unsent)) from None
            explained = yield from explain_unreachable(conn, err, unsent)
            raise (may_have_run(method, err) if explained is err else explained) from None


def open_stream(
    conn: Connection,
    method: str,
    path: str,
    *,
    timeout: float | None,
    headers: Mapping[str, str] | None = None,
    json: Any = None,
) -> Flow[StreamHandle]:
    """Open a streamed response (read with `ReadLine`/`ReadChunk`); a non-2xx status raises after reading it.

    Not retried: streaming calls are either POSTs (exec) or reads whose caller may already hold bytes.
    """
    check_timeout(timeout)
    for refreshed in (False, True):
        target: Target = yield from conn.resolve()
        req = _request(target, method, path, timeout=timeout, headers=headers, json=json)
        try:
            handle: StreamHandle = yield Open(req)
        except SandboxRequestError:
            conn.failed()
            raise
        if 200 <= handle.status_code < 300:
            break
        if handle.status_code >= 500:
            conn.failed()
        body = b""
        while (chunk := (yield ReadChunk(handle))) is not None and len(body) < 65536:
            body += chunk
        answer = HttpResponse(handle.status_code, handle.headers, body, method, req.url)
        if not refreshed and _refused_for_stale_pod_ip(answer):
            conn.failed()  # the router forwarded nothing: send it again with the current address
            continue
        try:
            check(answer)
        except SandboxRequestError as err:
            if handle.status_code in AUTH_STATUSES:
                raise explain_refusal(conn, err, req.headers) from None
            if handle.status_code not in UNREACHABLE:
                raise
            explained = yield from explain_unreachable(conn, err)
            raise (may_have_run(method, err) if explained is err else explained) from None
    return handle
