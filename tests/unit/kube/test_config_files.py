"""Kubeconfig files read as kubectl reads them: `$KUBECONFIG` lists merged, paths per file, cluster extras."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.kube import ConfigError, load_config, x509
from agent_sandbox.kube._config import ExecAuth, TokenFileAuth

pytestmark = pytest.mark.unit


def _write(path: Path, doc: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _cluster(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": f"http://{name}.invalid:1", **fields}}


def _context(name: str, cluster: str, user: str | None = None, **fields: Any) -> dict[str, Any]:
    body = {"cluster": cluster, **fields}
    if user:
        body["user"] = user
    return {"name": name, "context": body}


def _kubeconfig_env(monkeypatch: pytest.MonkeyPatch, *paths: str) -> None:
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(paths))


def test_first_file_defining_a_name_wins_whole_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _write(
        tmp_path / "a" / "config",
        {"clusters": [_cluster("shared")], "contexts": [_context("ctx", "shared", namespace="from-a")]},
    )
    b = _write(
        tmp_path / "b" / "config",
        {
            "current-context": "ctx",
            # Same names as in a: ignored entirely, the CA and tls-server-name included (kubectl never merges
            # an entry field by field).
            "clusters": [_cluster("shared", **{"tls-server-name": "b-name", "certificate-authority": "ca"})],
            "contexts": [_context("ctx", "shared", namespace="from-b"), _context("only-b", "shared")],
        },
    )
    _kubeconfig_env(monkeypatch, str(tmp_path / "missing"), a, "", b)
    cfg = load_config()
    assert cfg.server == "http://shared.invalid:1"
    assert cfg.namespace == "from-a"
    assert cfg.tls_server_name is None
    assert cfg.source == os.pathsep.join([a, b])
    assert load_config(context="only-b").namespace == "default"  # a context only the second file has


def test_current_context_from_the_first_file_that_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _write(tmp_path / "first", {"current-context": ""})  # empty: does not count
    second = _write(tmp_path / "second", {"current-context": "two"})
    third = _write(
        tmp_path / "third",
        {
            "current-context": "three",
            "clusters": [_cluster("k")],
            "contexts": [_context("two", "k", namespace="ns-two"), _context("three", "k", namespace="ns-3")],
        },
    )
    empty = tmp_path / "empty"
    empty.write_text("")  # an empty file is an empty config, not an error
    _kubeconfig_env(monkeypatch, str(empty), first, second, third)
    assert load_config().namespace == "ns-two"


def _pki(directory: Path) -> None:
    """ca.pem, and a client c.pem + k.pem it signs, in `directory`."""
    now = dt.datetime.now(dt.UTC)
    ca_key, client_key = x509.new_key(), x509.new_key()
    window = {"not_before": now - dt.timedelta(minutes=1), "not_after": now + dt.timedelta(hours=1)}
    ca = x509.issue(x509.name("test-ca"), ca_key, issuer=None, ca=True, **window)
    client = x509.issue(
        x509.name("u"), client_key, issuer=x509.Issuer(ca, ca_key), usages=[x509.CLIENT_AUTH], **window
    )
    (directory / "ca.pem").write_bytes(x509.cert_pem(ca))
    (directory / "c.pem").write_bytes(x509.cert_pem(client))
    (directory / "k.pem").write_bytes(x509.key_pem(client_key))


async def test_relative_paths_resolve_against_their_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The selecting file is first; the cluster, the users and their files live next to the second file only.
    selector = _write(tmp_path / "sel" / "config", {"current-context": "token"})
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    _pki(other)
    (other / "tok").write_text("from-token-file")
    plugin = other / "bin" / "plugin"
    plugin.write_text(
        '#!/bin/sh\necho \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"from-plugin"}}\'\n'
    )
    plugin.chmod(0o755)
    exec_v1 = "client.authentication.k8s.io/v1"
    doc = {
        "clusters": [
            {
                "name": "k",
                "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "../other/ca.pem"},
            }
        ],
        "users": [
            {"name": "t", "user": {"tokenFile": "tok"}},
            {"name": "c", "user": {"client-certificate": "c.pem", "client-key": "./k.pem"}},
            {"name": "e", "user": {"exec": {"apiVersion": exec_v1, "command": "./bin/plugin"}}},
            {"name": "p", "user": {"exec": {"apiVersion": exec_v1, "command": "sh"}}},
        ],
        "contexts": [
            _context("token", "k", "t"),
            _context("cert", "k", "c"),
            _context("exec", "k", "e"),
            _context("path", "k", "p"),
        ],
    }
    _kubeconfig_env(monkeypatch, selector, _write(other / "config", doc))
    # Run from elsewhere: a path resolved against the working directory (or the first file) would miss.
    monkeypatch.chdir(tmp_path / "sel")

    cfg = load_config()
    assert cfg.ssl is not None
    assert [dict(c["subject"][0])["commonName"] for c in cfg.ssl.get_ca_certs()] == ["test-ca"]
    assert isinstance(cfg.auth, TokenFileAuth)
    assert await cfg.auth.header() == "Bearer from-token-file"

    assert load_config(context="cert").ssl is not None  # client certificate and key found and loaded

    exec_auth = load_config(context="exec").auth
    assert isinstance(exec_auth, ExecAuth)
    assert exec_auth._argv[0] == str(plugin)
    assert await exec_auth.header() == "Bearer from-plugin"

    path_auth = load_config(context="path").auth
    assert isinstance(path_auth, ExecAuth)
    assert path_auth._argv[0] == "sh"  # no separator: looked up on PATH, left alone


def test_relative_exec_command_in_a_single_explicit_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(
        tmp_path / "kube" / "config",
        {
            "current-context": "c",
            "clusters": [_cluster("k")],
            "users": [
                {
                    "name": "u",
                    "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/x"}},
                }
            ],
            "contexts": [_context("c", "k", "u")],
        },
    )
    monkeypatch.chdir(tmp_path)
    auth = load_config(path).auth
    assert isinstance(auth, ExecAuth)
    assert auth._argv[0] == str(tmp_path / "kube" / "bin" / "x")


def test_tls_server_name_and_proxy_url_of_the_context_cluster(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "config",
        {
            "current-context": "tunnel",
            "clusters": [
                _cluster("plain"),
                {
                    "name": "tunnelled",
                    "cluster": {
                        "server": "https://127.0.0.1:16443",
                        "insecure-skip-tls-verify": True,
                        "tls-server-name": "kubernetes",
                        "proxy-url": "http://127.0.0.1:3128",
                    },
                },
            ],
            "contexts": [_context("tunnel", "tunnelled"), _context("plain", "plain")],
        },
    )
    cfg = load_config(path)
    assert cfg.tls_server_name == "kubernetes"
    assert cfg.proxy_url == "http://127.0.0.1:3128"
    plain = load_config(path, context="plain")
    assert (plain.tls_server_name, plain.proxy_url) == (None, None)


@pytest.mark.parametrize("proxy", ["socks5://127.0.0.1:1080", "socks5h://user:secret@127.0.0.1:1080"])
def test_socks_proxy_is_refused_by_name(tmp_path: Path, proxy: str) -> None:
    path = _write(
        tmp_path / "config",
        {
            "current-context": "c",
            "clusters": [_cluster("k", **{"proxy-url": proxy})],
            "contexts": [_context("c", "k")],
        },
    )
    with pytest.raises(ConfigError, match=r"proxy-url.*only http:// and https:// proxies") as err:
        load_config(path)
    assert "secret" not in str(err.value)


def test_https_proxy_is_accepted(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "config",
        {
            "current-context": "c",
            "clusters": [_cluster("k", **{"proxy-url": "https://proxy.invalid:443"})],
            "contexts": [_context("c", "k")],
        },
    )
    assert load_config(path).proxy_url == "https://proxy.invalid:443"


def test_malformed_file_in_the_list_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _write(
        tmp_path / "good",
        {"current-context": "c", "clusters": [_cluster("k")], "contexts": [_context("c", "k")]},
    )
    bad = tmp_path / "bad"
    bad.write_text("clusters: [unclosed\n")
    _kubeconfig_env(monkeypatch, good, str(bad))
    with pytest.raises(ConfigError, match=str(bad)):
        load_config()


def test_a_kubeconfig_variable_naming_only_missing_files_is_an_error_not_the_home_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kubectl and the SDK: a set `$KUBECONFIG` replaces ~/.kube/config. Until December 6 one naming only
    missing files fell back to ~/.kube/config - maybe another cluster, where `agent-sandbox lifecycle` acted."""
    home = tmp_path / "home"
    _write(
        home / ".kube" / "config",
        {"current-context": "c", "clusters": [_cluster("other")], "contexts": [_context("c", "other")]},
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _kubeconfig_env(monkeypatch, str(tmp_path / "typo"))
    with pytest.raises(ConfigError, match=r"KUBECONFIG .*typo: no such file"):
        load_config()
    monkeypatch.setenv("KUBECONFIG", "")
    assert load_config().server == "http://other.invalid:1"  # unset or empty: the home file, as kubectl
    monkeypatch.setenv("KUBECONFIG", os.pathsep)  # only a separator: set, so kubectl reads no file at all
    with pytest.raises(ConfigError, match=r"KUBECONFIG ':' names no file \(KUBECONFIG is set"):
        load_config()
