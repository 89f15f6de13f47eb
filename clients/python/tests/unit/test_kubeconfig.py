"""Kubeconfig resolution as kubectl does it: `$KUBECONFIG` lists files that are merged (pure config logic)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import yaml

from agent_sandbox_sdk._kubeconfig import load_kube_endpoint

pytestmark = pytest.mark.unit

CA = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")


def _write(path: Path, doc: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_files_of_kubeconfig_are_merged_as_kubectl_merges_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file sets current-context, another holds the contexts (`KUBECONFIG=~/.kube/config:~/.kube/eks.yaml`):
    only the first file was read, and it failed with `KeyError: 'clusters'`."""
    first = _write(
        tmp_path / "home" / "config", {"apiVersion": "v1", "kind": "Config", "current-context": "b"}
    )
    ca_dir = tmp_path / "eks"
    ca_dir.mkdir()
    (ca_dir / "ca.crt").write_bytes(CA.read_bytes())  # the system's bundle stands in for a cluster CA
    second = _write(
        ca_dir / "eks.yaml",
        {
            "clusters": [
                {
                    "name": "b",
                    "cluster": {"server": "https://b.example:6443", "certificate-authority": "ca.crt"},
                },
                {"name": "dup", "cluster": {"server": "https://second.example"}},
            ],
            "users": [{"name": "b", "user": {"token": "tok-b"}}],
            "contexts": [
                {"name": "b", "context": {"cluster": "b", "user": "b", "namespace": "team-b"}},
                {"name": "dup", "context": {"cluster": "dup", "user": "b"}},
            ],
            "current-context": "dup",  # the first file's wins
        },
    )
    third = _write(
        tmp_path / "third.yaml",
        {"clusters": [{"name": "dup", "cluster": {"server": "https://third.example"}}], "contexts": []},
    )
    missing = tmp_path / "absent.yaml"
    monkeypatch.setenv("KUBECONFIG", ":".join(map(str, [missing, first, second, third])))
    endpoint = load_kube_endpoint()
    # the relative certificate-authority is the second file's own (resolved against its directory)
    assert (endpoint.base_url, endpoint.namespace) == ("https://b.example:6443", "team-b")
    assert isinstance(endpoint.verify, ssl.SSLContext)
    # the first file to name a cluster wins
    assert load_kube_endpoint(context="dup").base_url == "https://second.example"


def test_a_file_without_clusters_is_an_error_that_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", {"apiVersion": "v1", "kind": "Config", "current-context": "x"})
    with pytest.raises(ValueError, match=r"kubeconfig .*config: Context 'x' not found"):
        load_kube_endpoint(kubeconfig=str(path))
    garbage = tmp_path / "garbage"
    garbage.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="not a mapping"):
        load_kube_endpoint(kubeconfig=str(garbage))


def _single_user(tmp_path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "http://kube.test"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    return str(_write(tmp_path / "config", doc))


def test_an_oidc_auth_provider_sends_its_id_token_and_a_401_says_how_to_refresh_it(tmp_path: Path) -> None:
    """`auth-provider: oidc` (what kubectl keeps refreshed) raised lightkube's ConfigError, a traceback in the
    CLI; gcp/azure providers, gone from every Kubernetes client, say what replaces them."""
    import httpx2

    from agent_sandbox_sdk import SandboxError

    provider = {
        "name": "oidc",
        "config": {"id-token": "id.tok.en", "idp-issuer-url": "https://issuer.example"},
    }
    endpoint = load_kube_endpoint(_single_user(tmp_path, {"auth-provider": provider}))
    seen: list[str] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers["Authorization"])
        return httpx2.Response(401 if len(seen) > 1 else 200, json={})

    with httpx2.Client(auth=endpoint.auth, transport=httpx2.MockTransport(handle)) as client:
        assert client.get("http://kube.test/").status_code == 200
        with pytest.raises(SandboxError, match=r"refused the OIDC id-token .* any kubectl command"):
            client.get("http://kube.test/")
    assert seen == ["Bearer id.tok.en"] * 2
    with pytest.raises(ValueError, match=r"auth-provider 'gcp' is not supported .* gke-gcloud-auth-plugin"):
        load_kube_endpoint(_single_user(tmp_path, {"auth-provider": {"name": "gcp", "config": {}}}))


def test_a_missing_certificate_file_is_an_error_that_names_it(tmp_path: Path) -> None:
    config = _single_user(
        tmp_path, {"token": "t"}, {"server": "https://kube.test", "certificate-authority": "missing-ca.crt"}
    )
    with pytest.raises(ValueError, match=r"kubeconfig .*config: .*No such file.*missing-ca\.crt"):
        load_kube_endpoint(config)


def test_a_clusters_tls_server_name_and_proxy_url_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lightkube's model drops both fields, so an SSH tunnel's `tls-server-name` failed certificate checks and a
    `proxy-url` was bypassed (the API server dialled directly) where kubectl works; the live requests are in
    tests/integration/sdk/test_kubeconfig_reach.py. With `$KUBECONFIG` merged, the context's cluster is read
    from whichever file defines it."""
    cluster = {
        "server": "https://127.0.0.1:16443",
        "tls-server-name": "kubernetes",
        "proxy-url": "http://p:3128",
    }
    endpoint = load_kube_endpoint(_single_user(tmp_path, {"token": "t"}, cluster))
    assert (endpoint.tls_server_name, endpoint.proxy_url) == ("kubernetes", "http://p:3128")
    plain = load_kube_endpoint(_single_user(tmp_path / "plain", {"token": "t"}))
    assert (plain.tls_server_name, plain.proxy_url) == (None, None)

    first = _write(tmp_path / "a.yaml", {"current-context": "x"})
    monkeypatch.setenv("KUBECONFIG", f"{first}:{_single_user(tmp_path / 'b', {'token': 't'}, cluster)}")
    assert load_kube_endpoint().tls_server_name == "kubernetes"


@pytest.mark.parametrize(
    ("proxy", "message"),
    [
        ("ftp://p:21", r"proxy-url 'ftp://p:21': the scheme must be http, https or socks5"),
        ("ftp://user:secret@p:21", r"proxy-url 'ftp://p:21': the scheme must be"),  # credentials not shown
        ("p:3128", r"proxy-url 'p:3128': the scheme must be"),
        (3128, r"cluster proxy-url must be a string, not 3128"),
    ],
)
def test_a_proxy_url_kubectl_would_refuse_is_an_error_that_names_the_field(
    tmp_path: Path, proxy: object, message: str
) -> None:
    config = _single_user(tmp_path, {"token": "t"}, {"server": "https://kube.test", "proxy-url": proxy})
    with pytest.raises(ValueError, match=message):
        load_kube_endpoint(config)


def test_a_socks_proxy_without_socksio_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "socksio" else real(name, *a)
    )
    config = _single_user(
        tmp_path, {"token": "t"}, {"server": "https://kube.test", "proxy-url": "socks5://b:1080"}
    )
    with pytest.raises(
        ValueError,
        match=r"SOCKS proxy, which needs the socksio package: pip install 'agent-sandbox-sdk\[socks\]'",
    ):
        load_kube_endpoint(config)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose ~/.kube/config works, outside any pod."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _write(tmp_path / "home" / ".kube" / "config", yaml.safe_load(_single_doc("https://home.example")))
    return tmp_path / "home"


def _single_doc(server: str) -> str:
    return yaml.safe_dump(
        {
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


@pytest.mark.usefixtures("home")
def test_a_kubeconfig_variable_naming_no_file_is_an_error_that_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kubectl: a `$KUBECONFIG` whose files are all missing is not replaced by ~/.kube/config (another
    cluster). Until December 6 `KUBECONFIG=/nonexistent agent-sandbox list` said "no Kubernetes configuration:
    ... set KUBECONFIG ..." without the file, or used ~/.kube/config when there was one."""
    missing = tmp_path / "nonexistent"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    with pytest.raises(ValueError, match=rf"^KUBECONFIG file {missing}: no such file \(KUBECONFIG is set"):
        load_kube_endpoint()
    other = tmp_path / "other"
    monkeypatch.setenv("KUBECONFIG", f"{missing}:{other}")
    with pytest.raises(ValueError, match=rf"^KUBECONFIG files {missing}, {other}: none exists"):
        load_kube_endpoint()
    monkeypatch.setenv("KUBECONFIG", ":")  # only a separator: set, so kubectl reads no file at all
    with pytest.raises(ValueError, match=r"^KUBECONFIG ':' names no file \(KUBECONFIG is set"):
        load_kube_endpoint()


@pytest.mark.usefixtures("home")
def test_missing_files_of_kubeconfig_are_skipped_when_one_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    there = tmp_path / "there.yaml"
    there.write_text(_single_doc("https://there.example"))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'nonexistent'}:{there}")
    assert load_kube_endpoint().base_url == "https://there.example"


def test_an_unset_or_empty_kubeconfig_variable_reads_the_home_file(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert load_kube_endpoint().base_url == "https://home.example"
    monkeypatch.setenv("KUBECONFIG", "")
    assert load_kube_endpoint().base_url == "https://home.example"


@pytest.mark.usefixtures("home")
def test_in_a_pod_a_kubeconfig_naming_no_file_falls_back_to_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """kubectl: `Config not found: FILE` (a warning), then the in-cluster configuration."""
    from agent_sandbox_sdk import _kubeconfig

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("sa-token")
    (account / "namespace").write_text("team-a")
    (account / "ca.crt").write_bytes(CA.read_bytes())
    monkeypatch.setattr(_kubeconfig, "_SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    missing = tmp_path / "nonexistent"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    with caplog.at_level("WARNING", logger="agent_sandbox_sdk"):
        endpoint = load_kube_endpoint()
    assert (endpoint.base_url, endpoint.namespace) == ("https://10.0.0.1:443", "team-a")
    assert f"KUBECONFIG file {missing}: no such file" in caplog.text
