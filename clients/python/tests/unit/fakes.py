"""An in-memory Kubernetes API + router + legacy runtime behind one httpx2 `MockTransport` handler.

For unit tests of the SDK's flows only (request shapes, retries, error mapping); real behaviour is tested
against the real control plane, router and runtime in the main project's tests/integration/sdk.
The same handler serves `SandboxClient` and `AsyncSandboxClient` (httpx2's MockTransport is both).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx2

from agent_sandbox_sdk._kubeconfig import KubeEndpoint

KUBE = "https://kube.test"
ROUTER = "http://router.test"
CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxclaims"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxes"
#: The API server's answer for an object that does not exist (a served type answers a `Status`).
NOT_FOUND = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}
#: Its answer to a write whose precondition (a DELETE's `preconditions.uid`) does not hold.
CONFLICT = {"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409}


def endpoint() -> KubeEndpoint:
    return KubeEndpoint(base_url=KUBE, verify=False, namespace="default", source="test")


def ready_condition(status: str = "True", reason: str = "SandboxReady", message: str = "") -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


@dataclass
class FakeCluster:
    """Claims become bound + Ready on the first watch, unless `claim_events` says otherwise."""

    #: Conditions the watch reports for a new claim (default: bound and Ready).
    claim_conditions: list[dict[str, Any]] = field(default_factory=lambda: [ready_condition()])
    bind: bool = True
    pod_ip: str = "127.10.0.5"
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[httpx2.Request] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    #: path -> queue of status codes to answer before the real handler (router/runtime faults).
    faults: dict[str, list[int]] = field(default_factory=dict)
    execute_extra: dict[str, Any] = field(default_factory=lambda: {"truncated": False})
    #: Called with each request after it was handled; an exception it returns is raised instead of the
    #: answer, once (the caller interrupted: a cancelled task, Ctrl-C).
    interrupt: Callable[[httpx2.Request], BaseException | None] | None = None
    #: As `interrupt`, but before the request is handled (the interruption landed before it reached the server).
    interrupt_before: Callable[[httpx2.Request], BaseException | None] | None = None
    rv: int = 100

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if self.interrupt_before is not None and (interruption := self.interrupt_before(request)) is not None:
            self.interrupt_before = None
            raise interruption
        path = request.url.raw_path.decode().split("?")[0]
        for prefix, codes in self.faults.items():
            if path.startswith(prefix) and codes:
                return httpx2.Response(codes.pop(0), json={"detail": f"fault for {path}"})
        answer = (
            self._kube(request, path) if request.url.host == "kube.test" else self._runtime(request, path)
        )
        if self.interrupt is not None and (interruption := self.interrupt(request)) is not None:
            self.interrupt = None
            raise interruption
        return answer

    # ------------------------------------------------------------------ Kubernetes API

    def _kube(self, request: httpx2.Request, path: str) -> httpx2.Response:
        parts = path.split("/")
        ns, plural = parts[5], parts[6]
        name = parts[7] if len(parts) > 7 else None
        store = self.claims if plural == "sandboxclaims" else self.sandboxes
        if request.method == "POST":
            body = json.loads(request.content)
            name = body["metadata"]["name"]
            if name in store:
                return httpx2.Response(409, json={"kind": "Status", "message": f"{name} already exists"})
            body["metadata"].update(namespace=ns, uid=f"uid-{name}", resourceVersion=self._next_rv())
            store[name] = body
            return httpx2.Response(201, json=body)
        if request.method == "GET" and request.url.params.get("watch") == "true":
            selected = request.url.params["fieldSelector"].split("=", 1)[1]
            obj = store.get(selected)
            if obj is None:
                return httpx2.Response(200, content=b"")
            if plural == "sandboxclaims":
                self._progress_claim(obj)
            line = json.dumps({"type": "MODIFIED", "object": obj}) + "\n"
            return httpx2.Response(200, content=line.encode())
        if request.method == "GET" and name is None:
            return httpx2.Response(200, json={"items": list(store.values()), "metadata": {}})
        if request.method == "GET":
            obj = store.get(name or "")
            return httpx2.Response(200, json=obj) if obj else httpx2.Response(404, json=NOT_FOUND)
        if request.method == "DELETE":
            if (obj := store.get(name or "")) is None:
                return httpx2.Response(404, json=NOT_FOUND)
            want = ((json.loads(request.content) if request.content else {}).get("preconditions") or {}).get(
                "uid"
            )
            have = obj.get("metadata", {}).get("uid")
            if want and want != have:  # the API server's answer to a failed UID precondition
                message = f"Precondition failed: UID in precondition: {want}, UID in object meta: {have}"
                return httpx2.Response(409, json={**CONFLICT, "message": message})
            del store[name or ""]
            return httpx2.Response(200, json={"kind": "Status"})
        if request.method == "PATCH":
            if (obj := store.get(name or "")) is None:
                return httpx2.Response(404, json=NOT_FOUND)
            patch = json.loads(request.content)
            obj.setdefault("spec", {}).update(patch.get("spec", {}))
            gen = obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            kind = "Suspended" if obj["spec"].get("operatingMode") == "Suspended" else "Ready"
            obj["status"]["conditions"] = [{"type": kind, "status": "True", "observedGeneration": gen}]
            return httpx2.Response(200, json=obj)
        return httpx2.Response(405)

    def _progress_claim(self, claim: dict[str, Any]) -> None:
        name = claim["metadata"]["name"]
        status: dict[str, Any] = {"conditions": self.claim_conditions}
        if self.bind:
            status["sandbox"] = {"name": name, "podIPs": [self.pod_ip]}
            self.sandboxes.setdefault(
                name,
                {
                    "metadata": {"name": name, "namespace": claim["metadata"]["namespace"], "generation": 1},
                    "spec": {},
                    "status": {"podIPs": [self.pod_ip], "conditions": [ready_condition()]},
                },
            )
        claim["status"] = status
        claim["metadata"]["resourceVersion"] = self._next_rv()

    # ------------------------------------------------------------------ router + legacy runtime

    def _runtime(self, request: httpx2.Request, path: str) -> httpx2.Response:
        if request.method == "POST" and path == "/execute":
            body = json.loads(request.content)
            return httpx2.Response(
                200,
                json={
                    "stdout": f"ran {body['command']}\n",
                    "stderr": "",
                    "exit_code": 0,
                    **self.execute_extra,
                },
            )
        if request.method == "POST" and path == "/upload":
            ctype = request.headers["content-type"]
            boundary = ctype.split("boundary=")[1].encode()
            part = request.content.split(b"--" + boundary)[1]
            head, _, data = part.partition(b"\r\n\r\n")
            filename = head.split(b'filename="')[1].split(b'"')[0].decode()
            self.files[filename] = data[: -len(b"\r\n")]
            return httpx2.Response(200, json={"message": "ok"})
        if request.method == "GET" and path.startswith("/download/"):
            key = unquote(path[len("/download/") :])
            if key not in self.files:
                return httpx2.Response(404, json={"message": "File not found"})
            return httpx2.Response(200, content=self.files[key])
        if request.method == "GET" and path.startswith("/list/"):
            prefix = unquote(path[len("/list/") :]).strip("/") + "/"
            names = [
                k[len(prefix) :] for k in self.files if k.startswith(prefix) and "/" not in k[len(prefix) :]
            ]
            entries = [
                {"name": n, "size": len(self.files[prefix + n]), "type": "file", "mod_time": 0} for n in names
            ]
            return httpx2.Response(200, json=entries)
        if request.method == "GET" and path.startswith("/exists/"):
            return httpx2.Response(200, json={"exists": unquote(path[len("/exists/") :]) in self.files})
        return httpx2.Response(404, json={"detail": "Not Found"})

    def find(self, predicate: Callable[[httpx2.Request], bool]) -> list[httpx2.Request]:
        return [r for r in self.requests if predicate(r)]
