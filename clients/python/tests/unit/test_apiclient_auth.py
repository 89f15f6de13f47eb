"""`api_client=` a kubernetes Configuration: its token is read at every request after its refresh hook, sync
or async, as the kubernetes clients read it (live clients: tests/integration/sdk/test_api_client_refresh.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk._kubeconfig import load_kube_endpoint

pytestmark = pytest.mark.unit


class Configuration:
    """The attributes of kubernetes.client.Configuration the SDK reads."""

    def __init__(self, **attrs: Any) -> None:
        self.host = "https://kube.test"
        self.verify_ssl = False
        self.api_key: dict[str, str] = {}
        self.api_key_prefix: dict[str, str] = {}
        self.refresh_api_key_hook: Any = None
        self.__dict__.update(attrs)


def _sent(endpoint: Any, calls: int) -> list[str]:
    seen: list[str] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("Authorization", ""))
        return httpx2.Response(200, json={})

    with httpx2.Client(auth=endpoint.auth, transport=httpx2.MockTransport(handle)) as client:
        for _ in range(calls):
            client.get("https://kube.test/")
    return seen


def test_the_hook_runs_before_every_request_and_its_token_is_sent() -> None:
    runs: list[int] = []

    def hook(cfg: Configuration) -> None:  # kubernetes' own: re-run the exec plugin once expired
        runs.append(1)
        cfg.api_key["BearerToken"] = f"Bearer token-{len(runs)}"

    endpoint = load_kube_endpoint(Configuration(refresh_api_key_hook=hook))
    assert _sent(endpoint, 3) == ["Bearer token-1", "Bearer token-2", "Bearer token-3"]


def test_an_async_hook_runs_in_the_sync_client_and_is_awaited_in_the_async_one() -> None:
    async def hook(cfg: Configuration) -> None:  # kubernetes_asyncio allows coroutine hooks
        await asyncio.sleep(0)
        cfg.api_key["authorization"] = "async-token"
        cfg.api_key_prefix["authorization"] = "Bearer"

    endpoint = load_kube_endpoint(Configuration(refresh_api_key_hook=hook))
    assert _sent(endpoint, 1) == ["Bearer async-token"]

    async def main() -> str:
        async def handle(request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(200, text=request.headers["Authorization"])

        async with httpx2.AsyncClient(auth=endpoint.auth, transport=httpx2.MockTransport(handle)) as client:
            return (await client.get("https://kube.test/")).text

    assert asyncio.run(main()) == "Bearer async-token"


def test_a_token_rewritten_in_place_is_sent_and_no_token_means_no_auth() -> None:
    cfg = Configuration(api_key={"BearerToken": "Bearer first"})
    endpoint = load_kube_endpoint(cfg)
    assert _sent(endpoint, 1) == ["Bearer first"]
    cfg.api_key["BearerToken"] = "Bearer second"  # kubernetes_asyncio's refresh_token task
    assert _sent(endpoint, 1) == ["Bearer second"]
    assert load_kube_endpoint(Configuration()).auth is None


def test_tls_server_name_and_proxy_of_the_configuration_are_kept() -> None:
    endpoint = load_kube_endpoint(Configuration(tls_server_name="kubernetes", proxy="http://127.0.0.1:3128"))
    assert (endpoint.tls_server_name, endpoint.proxy_url) == ("kubernetes", "http://127.0.0.1:3128")
