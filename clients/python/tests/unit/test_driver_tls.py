"""Which TLS context each of the driver's HTTP clients gets (`_driver_base.DriverBase._client_kwargs`).

Building httpx2's default verifying context loads the CA bundle (~50 ms of CPU, synchronously): it must
happen at most once per process, and never for plain-HTTP sandbox traffic, where it used to stall every
concurrent flow on the event loop when the first sandbox became Ready (docs/performance.md, SDK).
"""

from __future__ import annotations

import ssl

import pytest

from agent_sandbox_sdk import _driver, _driver_base
from agent_sandbox_sdk._steps import HttpRequest, TlsSettings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _verify(
    driver: _driver.AsyncDriver | _driver.SyncDriver, url: str, tls: TlsSettings | None = None
) -> object:
    _key, kw = driver._client_kwargs(HttpRequest("GET", url, tls=tls))
    return kw["verify"]


@pytest.mark.parametrize("driver_class", [_driver.SyncDriver, _driver.AsyncDriver])
def test_plain_http_loads_no_ca_bundle_and_stays_fail_closed(driver_class: type) -> None:
    verify = _verify(driver_class(None), "http://127.0.0.1:8080/execute")
    assert isinstance(verify, ssl.SSLContext)
    assert verify.cert_store_stats()["x509_ca"] == 0  # nothing loaded
    assert verify.verify_mode == ssl.CERT_REQUIRED  # so it could trust nothing
    assert verify.check_hostname


def test_plain_http_shares_one_pool_whatever_the_tls_settings() -> None:
    driver = _driver.AsyncDriver(None)
    keys = {
        driver._client_kwargs(HttpRequest("GET", "HTTP://router:8080/x", tls=tls))[0]
        for tls in (None, TlsSettings(), TlsSettings(ca_cert="/nonexistent/ca.pem"))
    }
    assert keys == {"plaintext"}


def test_https_uses_the_default_context_built_once_per_process() -> None:
    first = _verify(_driver.AsyncDriver(None), "https://gateway.example/execute")
    second = _verify(_driver.SyncDriver(None), "https://other.example/execute", TlsSettings())
    assert isinstance(first, ssl.SSLContext)
    assert first is second is _driver_base.default_tls_context()
    assert first.cert_store_stats()["x509_ca"] > 0  # the real trust store: verification unchanged


def test_a_proxy_from_the_environment_gets_the_verifying_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "https://proxy.example:3128")
    assert _verify(_driver.AsyncDriver(None), "http://router:8080/x") is _driver_base.default_tls_context()


@pytest.mark.parametrize("driver_class", [_driver.SyncDriver, _driver.AsyncDriver])
def test_a_pooled_client_is_found_without_building_its_settings_again(
    driver_class: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request looked its client up by building a TLS context and reading the environment's proxies
    (~170 us, on the event loop); only the request that creates the client may pay for that."""
    built: list[str] = []
    real = _driver_base._plaintext_tls_context
    monkeypatch.setattr(_driver_base, "_plaintext_tls_context", lambda: built.append("tls") or real())
    driver = driver_class(None)
    clients = {
        id(driver._client(HttpRequest("POST", f"http://127.0.0.1:8080/execute?{i}"))) for i in range(5)
    }
    assert len(clients) == 1
    assert built == ["tls"]
