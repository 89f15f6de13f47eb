"""Exec credential plugins (kubeconfig `users[].user.exec`): the protocol versions, caching until expiry, the
401 retry, and the errors a user can act on. Real plugin processes; the API server is an in-memory handler."""

from __future__ import annotations

import asyncio
import json
import ssl
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest
import yaml

from agent_sandbox_sdk import SandboxError
from agent_sandbox_sdk._execauth import ExecCredentialAuth
from agent_sandbox_sdk._kubeconfig import load_kube_endpoint

pytestmark = pytest.mark.unit

V1 = "client.authentication.k8s.io/v1"


def _plugin(tmp_path: Path, status: dict[str, object], *, exit_code: int = 0) -> tuple[Path, Path]:
    """A plugin script printing an ExecCredential with `status` (tokens numbered by run) and logging each
    run's KUBERNETES_EXEC_INFO."""
    runs = tmp_path / "runs.log"
    script = tmp_path / "plugin.sh"
    body = (
        tmp_path / "credential.json"
    )  # a file: sh's echo would turn a PEM's escaped newlines into real ones
    body.write_text(json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": status}))
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$KUBERNETES_EXEC_INFO" >> {runs}\n'
        f"n=$(wc -l < {runs} | tr -d ' ')\n"
        f'sed "s/TOKEN/tok-$n/" {body}\n'
        + (f"echo 'plugin says no' >&2; exit {exit_code}\n" if exit_code else "")
    )
    script.chmod(0o755)
    return script, runs


def _api(seen: list[str], reject: set[str] = frozenset()) -> httpx2.MockTransport:  # type: ignore[assignment]
    def handle(request: httpx2.Request) -> httpx2.Response:
        auth = request.headers.get("Authorization", "")
        seen.append(auth)
        return httpx2.Response(401 if auth in reject else 200, json={})

    return httpx2.MockTransport(handle)


def test_the_token_is_run_for_once_and_kept_until_it_expires(tmp_path: Path) -> None:
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    script, runs = _plugin(tmp_path, {"token": "TOKEN", "expirationTimestamp": future})
    seen: list[str] = []
    auth = ExecCredentialAuth(str(script), [], {}, V1)
    with httpx2.Client(auth=auth, transport=_api(seen)) as client:
        for _ in range(3):
            assert client.get("http://kube.test/").status_code == 200
    assert seen == ["Bearer tok-1"] * 3
    assert [json.loads(line) for line in runs.read_text().splitlines()] == [
        {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}
    ]


def test_an_expired_token_is_fetched_again(tmp_path: Path) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    script, _ = _plugin(tmp_path, {"token": "TOKEN", "expirationTimestamp": past})
    seen: list[str] = []
    with httpx2.Client(auth=ExecCredentialAuth(str(script), [], {}, V1), transport=_api(seen)) as client:
        client.get("http://kube.test/")
        client.get("http://kube.test/")
    assert seen == ["Bearer tok-1", "Bearer tok-2"]


def test_a_401_runs_the_plugin_again_and_retries_once(tmp_path: Path) -> None:
    script, _ = _plugin(tmp_path, {"token": "TOKEN"})  # no expiry: kept until refused
    seen: list[str] = []

    async def main() -> int:
        auth = ExecCredentialAuth(str(script), [], {}, V1)
        async with httpx2.AsyncClient(auth=auth, transport=_api(seen, reject={"Bearer tok-1"})) as client:
            return (await client.get("http://kube.test/")).status_code

    assert asyncio.run(main()) == 200
    assert seen == ["Bearer tok-1", "Bearer tok-2"]


@pytest.mark.parametrize(
    ("status", "exit_code", "message"),
    [
        ({"token": "TOKEN"}, 3, r"plugin '.*plugin.sh' failed \(exit 3\): plugin says no"),
        ({"clientCertificateData": "x"}, 0, "returned clientCertificateData without clientKeyData"),
        ({"clientCertificateData": "x", "clientKeyData": "y"}, 0, "a client given a KubeEndpoint cannot use"),
        ({}, 0, "returned neither a token nor a client certificate"),
        ({"token": 7}, 0, "token and certificate fields must be strings"),
    ],
)
def test_plugin_failures_say_what_went_wrong(
    tmp_path: Path, status: dict[str, object], exit_code: int, message: str
) -> None:
    script, _ = _plugin(tmp_path, status, exit_code=exit_code)
    with (
        httpx2.Client(auth=ExecCredentialAuth(str(script), [], {}, V1), transport=_api([])) as client,
        pytest.raises(SandboxError, match=message),
    ):
        client.get("http://kube.test/")


def test_kubeconfig_versions_relative_commands_env_and_hints(tmp_path: Path) -> None:
    script, runs = _plugin(tmp_path, {"token": "TOKEN"})
    script.rename(tmp_path / "bin-plugin.sh")

    def kubeconfig(exec_config: dict[str, object]) -> str:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "http://kube.test"}}],
            "users": [{"name": "u", "user": {"exec": exec_config}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
        path = tmp_path / "config"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    for version in ("v1", "v1beta1", "v1alpha1"):
        endpoint = load_kube_endpoint(
            kubeconfig(
                {
                    "apiVersion": f"client.authentication.k8s.io/{version}",
                    "command": "./bin-plugin.sh",
                    "env": [{"name": "EXTRA", "value": "1"}],
                }
            )
        )
        seen: list[str] = []
        with httpx2.Client(auth=endpoint.auth, transport=_api(seen)) as client:
            client.get("http://kube.test/")
        assert seen[0].startswith("Bearer tok-")
    assert len(runs.read_text().splitlines()) == 3  # one run per kubeconfig loaded
    with pytest.raises(ValueError, match=r"apiVersion 'client\.authentication\.k8s\.io/v2' is not one of"):
        load_kube_endpoint(kubeconfig({"apiVersion": "client.authentication.k8s.io/v2", "command": "x"}))
    missing = load_kube_endpoint(
        kubeconfig({"apiVersion": V1, "command": "no-such-plugin-xyz", "installHint": "brew install xyz\n"})
    )
    with httpx2.Client(auth=missing.auth, transport=_api([])) as client, pytest.raises(SandboxError) as info:
        client.get("http://kube.test/")
    assert str(info.value) == "kubeconfig exec plugin 'no-such-plugin-xyz' not found: brew install xyz"


def _certificate_status() -> dict[str, object]:
    """A self-signed client certificate and its key, PEM, as a plugin prints them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plugin-user")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {
        "clientCertificateData": cert.public_bytes(serialization.Encoding.PEM).decode(),
        "clientKeyData": key_pem.decode(),
    }


def test_a_client_certificate_goes_into_a_context_of_its_own_and_a_token_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"  # where the key is written for `ssl` to load it
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    status = {**_certificate_status(), "token": "TOKEN"}
    script, _ = _plugin(tmp_path, status)
    made: list[ssl.SSLContext] = []

    def trust() -> ssl.SSLContext:
        made.append(ssl.create_default_context())
        return made[-1]

    auth = ExecCredentialAuth(str(script), [], {}, V1, trust=trust)
    first = auth.credential()
    assert first.tls is made[0]
    assert (first.header, first.serial) == ("Bearer tok-1", 1)
    assert auth.credential() is first  # kept: no expiry
    assert list(scratch.iterdir()) == []  # the key's file is gone
    # the certificate alone is a credential too, and it is not sent as a header
    (tmp_path / "bare").mkdir()
    script, _ = _plugin(tmp_path / "bare", _certificate_status())
    seen: list[str] = []
    with httpx2.Client(
        auth=ExecCredentialAuth(str(script), [], {}, V1, trust=trust), transport=_api(seen)
    ) as client:
        client.get("http://kube.test/")
    assert seen == [""]


def test_a_certificate_that_does_not_load_is_named(tmp_path: Path) -> None:
    status = _certificate_status()
    status["clientKeyData"] = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    script, _ = _plugin(tmp_path, status)
    auth = ExecCredentialAuth(str(script), [], {}, V1, trust=ssl.create_default_context)
    with pytest.raises(SandboxError, match="returned a client certificate and key that do not load"):
        auth.credential()
