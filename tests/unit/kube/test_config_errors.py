"""A kubeconfig whose certificate files are missing or bad: one ConfigError naming the kubeconfig and the file.

Until December 6 a missing certificate-authority file escaped as ssl's bare `FileNotFoundError: [Errno 2] No
such file or directory` (no file named), and the controller died with a 35-line traceback.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from agent_sandbox.devcluster.certs import make_ca
from agent_sandbox.kube import ConfigError, load_config

pytestmark = pytest.mark.unit


def _kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path = tmp_path / "kubeconfig"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_missing_certificate_authority_is_named(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"certificate-authority": "pki/ca.crt"}, {"token": "t"})
    with pytest.raises(ConfigError) as failed:
        load_config(path)
    assert str(failed.value) == (
        f"kubeconfig {path}: cannot load certificate-authority {tmp_path / 'pki' / 'ca.crt'}: "
        "[Errno 2] No such file or directory"
    )


def test_a_file_that_is_not_a_certificate_is_named(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    path = _kubeconfig(tmp_path, {"certificate-authority": "ca.crt"}, {"token": "t"})
    with pytest.raises(
        ConfigError, match=rf"^kubeconfig {path}: cannot load certificate-authority {tmp_path / 'ca.crt'}: "
    ):
        load_config(path)


def test_missing_client_certificate_names_its_files(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {}, {"client-certificate": "admin.crt", "client-key": "admin.key"})
    with pytest.raises(ConfigError) as failed:
        load_config(path)
    assert str(failed.value) == (
        f"kubeconfig {path}: cannot load client certificate (files: {tmp_path / 'admin.crt'}, "
        f"{tmp_path / 'admin.key'}): [Errno 2] No such file or directory"
    )


def test_the_controller_reports_it_in_one_line_and_exits_1(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"certificate-authority": "pki/ca.crt"}, {"token": "t"})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_sandbox.controllers.main",
            f"--kubeconfig={path}",
            "--leader-elect=false",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if '"level":"error"' in line]
    assert len(errors) == 1, output
    assert f"cannot load certificate-authority {tmp_path / 'pki' / 'ca.crt'}" in errors[0]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("abc", r"not valid base64 \(Incorrect padding\)"),
        (base64.b64encode(b"\xff\xfe").decode(), "not PEM text once base64-decoded"),
        (base64.b64encode(b"not a certificate\n").decode(), "no start line"),
    ],
    ids=["bad-base64", "not-text", "not-pem"],
)
def test_bad_certificate_authority_data_names_the_kubeconfig_and_the_field(
    tmp_path: Path, data: str, reason: str
) -> None:
    """It escaped as a bare `binascii.Error: Incorrect padding` or ssl's `SSLError`, naming neither."""
    path = _kubeconfig(tmp_path, {"certificate-authority-data": data}, {"token": "t"})
    with pytest.raises(
        ConfigError, match=rf"^kubeconfig {path}: invalid certificate-authority-data: {reason}"
    ):
        load_config(path)


@pytest.mark.parametrize("field", ["client-certificate-data", "client-key-data"])
def test_bad_client_certificate_data_names_the_kubeconfig_and_the_field(tmp_path: Path, field: str) -> None:
    user = {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5", field: "abc"}
    path = _kubeconfig(tmp_path, {}, user)
    with pytest.raises(ConfigError, match=rf"^kubeconfig {path}: invalid {field}: not valid base64"):
        load_config(path)


def test_a_certificate_authority_gone_when_the_exec_plugin_renews_is_named(tmp_path: Path) -> None:
    """The cluster's trust is built again for each certificate an exec plugin returns: a CA file removed
    since the start raised ssl's bare FileNotFoundError from the request that ran the plugin."""
    ca = tmp_path / "ca.crt"
    ca.write_bytes(make_ca("test-ca")[0].public_bytes(serialization.Encoding.PEM))
    plugin = tmp_path / "plugin.py"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": "cert", "clientKeyData": "key"},
    }
    plugin.write_text(f"print({json.dumps(json.dumps(credential))})\n")
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(plugin)],
    }
    path = _kubeconfig(tmp_path, {"certificate-authority": "ca.crt"}, {"exec": exec_})
    config = load_config(path)  # the CA file is fine now
    ca.unlink()
    with pytest.raises(ConfigError) as failed:
        asyncio.run(config.auth.header())
    assert str(failed.value) == (
        f"kubeconfig {path}: cannot load certificate-authority {ca}: [Errno 2] No such file or directory"
    )
