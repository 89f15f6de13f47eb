"""The few Kubernetes API calls the SDK makes, as flows (spec §5.2): claims, sandboxes, pools, templates.

Hand-written REST on the shared httpx2 stack rather than a generated client: nine verbs on four
resources, and the same flow then runs sync and async. API errors become `SandboxRequestError` with the
server's `Status.message`; a 404 for an absent object is returned as None where "absent" is a normal answer
(a 404 for an API the server does not serve is an error that says so).
"""

from __future__ import annotations

import codecs
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from ._steps import Emit, Flow, HttpRequest, HttpResponse, Open, ReadChunk, ReadLine, Send, Sleep
from .constants import (
    ARCHIVE_PLURAL_NAME,
    CLAIM_API_GROUP,
    CLAIM_API_VERSION,
    CLAIM_PLURAL_NAME,
    LIFECYCLE_API_GROUP,
    LIFECYCLE_API_VERSION,
    SANDBOX_API_GROUP,
    SANDBOX_API_VERSION,
    SANDBOX_PLURAL_NAME,
)
from .exceptions import (
    SandboxClientClosedError,
    SandboxConnectionError,
    SandboxRequestError,
    SandboxRequestTimeoutError,
)

__all__ = [
    "KubeResource",
    "check_kube",
    "create",
    "delete",
    "follow_pod_logs",
    "get",
    "list_objects",
    "merge_patch",
    "object_not_found",
    "pod_logs",
    "watch_one",
]

#: Kubernetes API calls are small; a stuck one should not hang a user for a minute.
KUBE_TIMEOUT = 30.0


class KubeResource:
    """A namespaced resource collection: `/apis/<group>/<version>/namespaces/<ns>/<plural>`."""

    def __init__(self, group: str, version: str, plural: str) -> None:
        self.group, self.version, self.plural = group, version, plural

    def path(self, namespace: str | None) -> str:
        """The collection in `namespace`; None: the collection across every namespace (lists only)."""
        if namespace is None:
            return f"/apis/{self.group}/{self.version}/{self.plural}"
        _require_name("namespace", namespace)
        return f"/apis/{self.group}/{self.version}/namespaces/{quote(namespace, safe='')}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        """One object. An empty name is refused (`ValueError`), never turned into the collection's path: a
        DELETE there is a deletecollection - every object of the namespace gone (until December 6,
        `delete_claim("")` did exactly that)."""
        _require_name(f"{self.plural[:-1]} name", name)
        return f"{self.path(namespace)}/{quote(name, safe='')}"


def _require_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")


CLAIMS = KubeResource(CLAIM_API_GROUP, CLAIM_API_VERSION, CLAIM_PLURAL_NAME)
SANDBOXES = KubeResource(SANDBOX_API_GROUP, SANDBOX_API_VERSION, SANDBOX_PLURAL_NAME)
WARM_POOLS = KubeResource(CLAIM_API_GROUP, CLAIM_API_VERSION, "sandboxwarmpools")
TEMPLATES = KubeResource(CLAIM_API_GROUP, CLAIM_API_VERSION, "sandboxtemplates")
ARCHIVES = KubeResource(LIFECYCLE_API_GROUP, LIFECYCLE_API_VERSION, ARCHIVE_PLURAL_NAME)


def _status_message(resp: HttpResponse) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, Mapping):
        return str(body.get("message") or body.get("reason") or body)[:500]
    return resp.text[:300]


def object_not_found(resp: HttpResponse) -> bool:
    """A 404 for an object that does not exist (a `Status` body), as opposed to a 404 for a resource type
    the server does not serve (plain `404 page not found`: the CRDs are not installed)."""
    if resp.status_code != 404:
        return False
    try:
        body = resp.json()
    except ValueError:
        return False
    return isinstance(body, Mapping) and body.get("kind") == "Status"


def check_kube(resp: HttpResponse, what: str) -> Any:
    """The decoded body of a 2xx answer; otherwise `SandboxRequestError` naming `what` and the server's message."""
    if resp.is_success:
        return resp.json() if resp.content else None
    message = _status_message(resp)
    if resp.status_code == 404 and not object_not_found(resp):
        message = f"{message.strip()} (this API is not served: are the agent-sandbox CRDs installed?)"
    elif resp.status_code == 401:
        # kubectl: "You must be logged in to the server"; the usual cause is a credential that ran out
        message = (
            f"{message.strip()} (the API server refused the kubeconfig's credentials: expired or revoked?)"
        )
    raise SandboxRequestError(
        f"Kubernetes API {what}: HTTP {resp.status_code}: {message}", resp.status_code, resp
    )


def check_streamed(handle: Any, request: HttpRequest, what: str) -> Flow[None]:
    """`check_kube` for a streamed request (a watch, a followed log): a refusal's (short) body is read first,
    so the error carries the server's message - the verb and resource a role lacks (a refused watch said
    only `HTTP 403` until December 6)."""
    if handle.status_code == 200:
        return
    body = b""
    while (chunk := (yield ReadChunk(handle))) is not None and len(body) < 65536:
        body += chunk
    check_kube(HttpResponse(handle.status_code, handle.headers, body, request.method, request.url), what)


def _req(method: str, path: str, **kw: Any) -> Send:
    kw.setdefault("timeout", KUBE_TIMEOUT)
    return Send(HttpRequest(method, path, kube=True, **kw))


def create(res: KubeResource, namespace: str, body: Mapping[str, Any]) -> Flow[HttpResponse]:
    """POST the object; returns the raw response (callers treat 409 themselves)."""
    resp: HttpResponse = yield _req("POST", res.path(namespace), json=dict(body))
    return resp


def get(res: KubeResource, namespace: str, name: str) -> Flow[dict[str, Any] | None]:
    """The object, or None if it does not exist."""
    resp: HttpResponse = yield _req("GET", res.object_path(namespace, name))
    if object_not_found(resp):
        return None
    return check_kube(resp, f"get {res.plural} {namespace}/{name}")  # type: ignore[no-any-return]


def list_objects(
    res: KubeResource, namespace: str | None, *, label_selector: str | None = None
) -> Flow[list[dict[str, Any]]]:
    """Every object of the collection (paged with `continue`); namespace None: of every namespace."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        params = {"limit": "500"}
        if label_selector:
            params["labelSelector"] = label_selector
        if token:
            params["continue"] = token
        resp: HttpResponse = yield _req("GET", res.path(namespace), params=params)
        body = check_kube(resp, f"list {res.plural} in {namespace or 'all namespaces'}")
        items.extend(body.get("items") or [])
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


#: How often a DELETE cut by the client's own `close()` is sent again.
_CLOSED_DELETE_RESENDS = 2


def delete(res: KubeResource, namespace: str, name: str, *, uid: str | None = None) -> Flow[bool]:
    """DELETE (with a UID precondition when given); True if it existed, False on 404.

    A DELETE cut by the client's own `close()` is sent again (on a new connection; it is idempotent): the
    rollback of a create that the close made fail runs into that same close (the client counts a close before
    it shuts its connections), and until December 7 it gave up, reporting the claim left behind."""
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}} if uid else None
    for attempt in range(_CLOSED_DELETE_RESENDS + 1):
        try:
            resp: HttpResponse = yield _req("DELETE", res.object_path(namespace, name), json=body)
            break
        except SandboxClientClosedError:
            if attempt == _CLOSED_DELETE_RESENDS:
                raise
    if object_not_found(resp):
        return False
    check_kube(resp, f"delete {res.plural} {namespace}/{name}")
    return True


def merge_patch(
    res: KubeResource, namespace: str, name: str, patch: Mapping[str, Any]
) -> Flow[dict[str, Any]]:
    """JSON merge patch; the updated object."""
    resp: HttpResponse = yield _req(
        "PATCH",
        res.object_path(namespace, name),
        content=json.dumps(patch).encode(),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    return check_kube(resp, f"patch {res.plural} {namespace}/{name}")  # type: ignore[no-any-return]


def pod_logs(
    namespace: str, pod: str, *, container: str | None, tail_lines: int | None, previous: bool = False
) -> Flow[str]:
    """The pod's log (core/v1 `pods/log`), or with `previous` its container's before the last restart;
    `SandboxRequestError` with the server's message when unavailable (a 400 when there was no restart)."""
    params = {k: str(v) for k, v in (("container", container), ("tailLines", tail_lines)) if v is not None}
    if previous:
        params["previous"] = "true"
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/log"
    resp: HttpResponse = yield _req("GET", path, params=params or None)
    if not resp.is_success:
        check_kube(resp, f"logs of pod {namespace}/{pod}")
    return resp.text


def follow_pod_logs(namespace: str, pod: str, *, container: str | None, tail_lines: int | None) -> Flow[None]:
    """Emit the pod's log as text while it is written (`pods/log?follow=true`), until the container stops or
    the caller stops reading; a refusal raises `SandboxRequestError` with the server's message."""
    params = {"follow": "true"}
    params.update(
        {k: str(v) for k, v in (("container", container), ("tailLines", tail_lines)) if v is not None}
    )
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/log"
    request = HttpRequest("GET", path, kube=True, params=params, timeout=None)
    handle = yield Open(request)
    yield from check_streamed(handle, request, f"logs of pod {namespace}/{pod}")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may straddle two chunks
    while (chunk := (yield ReadChunk(handle))) is not None:
        if text := decoder.decode(chunk):
            yield Emit(text)
    if tail := decoder.decode(b"", final=True):
        yield Emit(tail)


def watch_one(
    res: KubeResource,
    namespace: str,
    name: str,
    *,
    resource_version: str | None,
    deadline: float,
    decide: Callable[[str, dict[str, Any]], Any],
) -> Flow[tuple[Any, str | None]]:
    """Watch one object (field selector on its name) until `decide(event_type, obj)` returns non-None.

    Returns (that value, None) or, when `deadline` (time.monotonic) passes first, (None, last rv).
    `decide` may raise to stop. 410 Gone restarts from `0` (the current state, as ADDED); a dropped
    connection reconnects after 0.5 s - not one the client's own `close()` cut (`SandboxClientClosedError` is
    raised: the wait is over, and a create's rollback runs); `ERROR` events other than 410 raise
    `SandboxRequestError`.
    """
    _require_name(f"{res.plural[:-1]} name", name)  # an empty field selector would match every object
    rv = resource_version or "0"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, rv
        params = {
            "watch": "true",
            "fieldSelector": f"metadata.name={name}",
            "resourceVersion": rv,
            "timeoutSeconds": str(max(1, math.ceil(remaining))),
            "allowWatchBookmarks": "false",
        }
        request = HttpRequest("GET", res.path(namespace), kube=True, params=params, timeout=remaining + 5)
        opened_at = time.monotonic()
        events = 0
        try:
            handle = yield Open(request)
            if handle.status_code == 410:
                rv = "0"
                continue
            yield from check_streamed(handle, request, f"watch {res.plural} {namespace}/{name}")
            while (line := (yield ReadLine(handle))) is not None:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        rv = "0"
                        break
                    raise SandboxRequestError(
                        f"Kubernetes API watch {res.plural} {namespace}/{name}: {obj.get('message')}",
                        obj.get("code"),
                    )
                events += 1
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                verdict = decide(str(event.get("type")), obj)
                if verdict is not None:
                    return verdict, rv
            if not events and time.monotonic() - opened_at < 1.0:
                yield Sleep(0.1)  # a server that ends empty watches at once must not make this spin
        except SandboxClientClosedError:
            raise
        except (SandboxConnectionError, SandboxRequestTimeoutError):
            yield Sleep(0.5)
