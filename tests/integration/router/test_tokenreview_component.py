"""The router as `k8s/router/tokenreview` configures it refuses a request without a token (tenant10 finding 2).

The component's authz flags are read from `kubectl kustomize` of a user's overlay (k8s + k8s/router +
k8s/router/tokenreview), not copied into the test, and the real router is started with them against the
real API server: a request with no `Authorization` header is 401 (JSON), a valid ServiceAccount token goes
through. Until December 7 the component set only `--authz-mode=tokenreview`, leaving the binary's
transitional default (no token: allowed), so the "tokenreview" install proxied anonymous requests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.manifests import REPO_ROOT
from agent_sandbox.router import Router

from .conftest import Backend, raw_request, request_bytes, with_identity

pytestmark = pytest.mark.integration


def _component_authz_flags(cluster: DevCluster, tmp_path: Path) -> list[str]:
    """The `--authz-*` arguments of the router Deployment an overlay with the tokenreview component renders."""
    k8s = REPO_ROOT / "k8s"
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(k8s, tmp_path)],
        "components": [os.path.relpath(k8s / c, tmp_path) for c in ("router", "router/tokenreview")],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    out = cluster.kubectl("kustomize", str(tmp_path), check=True)
    (router,) = [
        d
        for d in yaml.safe_load_all(out.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "sandbox-router"
    ]
    args: list[str] = router["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith("--authz-")]


def _token(cluster: DevCluster, namespace: str) -> str:
    admin = cluster.admin()
    status, _ = admin.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "caller"}}
    )
    assert status == 201
    status, body = admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/caller/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    assert status == 201, body
    token: str = body["status"]["token"]
    return token


async def test_the_tokenreview_component_refuses_a_request_without_a_token(
    start_router: Callable[..., Awaitable[Router]],
    cluster: DevCluster,
    namespace: str,
    backend: Backend,
    tmp_path: Path,
) -> None:
    flags = _component_authz_flags(cluster, tmp_path)
    assert "--authz-mode=tokenreview" in flags
    router = await start_router(*with_identity(cluster, *flags))

    async def get(headers: dict[str, str]) -> tuple[int, object]:
        resp = await raw_request(router.http_port or 0, request_bytes("GET", "/hello", headers))
        return resp.status, json.loads(resp.body)

    assert await get(backend.headers()) == (401, {"detail": "unauthenticated"})
    assert not backend.seen
    token = _token(cluster, namespace)
    status, _ = await get(backend.headers(Authorization=f"Bearer {token}"))
    assert status == 200
    assert len(backend.seen) == 1
