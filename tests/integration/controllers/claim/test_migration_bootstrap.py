"""The v1alpha1 template-only claim and `helm/files/migrate.sh` on a real control plane (api spec §8.4, §8.7).

Upstream's typical v1alpha1 claim names only a template; conversion serves it as a v1beta1 claim on
`shadow-pool-<template>`, which nobody created: the claim says `WarmPoolNotFound`, with a hint that names
the fix. The migration script's bootstrap phase creates the pool (replicas 0) and the claim cold-starts
from it; a rerun changes nothing; `--dry-run` changes nothing; the migrate phase stamps
`agents.x-k8s.io/storage-migrated-at` on every object of the four kinds. The script runs with the
cluster's own kubectl (the same binary `DevCluster.kubectl` uses).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from agent_sandbox.manifests import REPO_ROOT
from tests.helpers import eventually, is_ready
from tests.integration.controllers.builders import template_body

pytestmark = pytest.mark.integration

SCRIPT = REPO_ROOT / "helm" / "files" / "migrate.sh"
EXT = "extensions.agents.x-k8s.io"
KINDS = (SANDBOX_WARM_POOL, SANDBOX_TEMPLATE, SANDBOX, SANDBOX_CLAIM)


def migrate(cluster: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the script with the cluster's kubectl; the caller checks the exit status."""
    argv = [
        "bash",
        str(SCRIPT),
        f"--kubectl={cluster.binaries.path('kubectl')}",
        f"--kubeconfig={cluster.kubeconfig}",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def v1alpha1_claim(name: str, template: str, **spec: Any) -> str:
    body = {
        "apiVersion": f"{EXT}/v1alpha1",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"sandboxTemplateRef": {"name": template}, **spec},
    }
    return json.dumps(body)


async def _eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


def ready_condition(obj: dict[str, Any]) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return dict(cond)
    return {}


async def stored(kube: ApiClient, ns: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every object of the four kinds in `ns`: kind -> name -> object."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in KINDS:
        out[kind.kind] = {o["metadata"]["name"]: o for o in await kube.list(kind, namespace=ns)}
    return out


async def test_a_v1alpha1_template_only_claim_is_served_after_the_bootstrap(
    kube: ApiClient, namespace: str, cluster: DevCluster, controller: Started
) -> None:
    ns = namespace
    await kube.create(SANDBOX_TEMPLATE, template_body("legacy"), namespace=ns)
    await kube.create(SANDBOX_TEMPLATE, template_body("unused"), namespace=ns)
    for name, spec in (("alpha", {}), ("beta", {"warmpool": "default"}), ("gamma", {"warmpool": "none"})):
        cluster.kubectl(
            "apply", "-n", ns, "-f", "-", input=v1alpha1_claim(name, "legacy", **spec), check=True
        )

    # A v1alpha1 claim on a pool of its own (missing): no shadow pool helps; the script says so.
    cluster.kubectl(
        "apply", "-n", ns, "-f", "-", input=v1alpha1_claim("delta", "legacy", warmpool="nowhere"), check=True
    )
    claim = await kube.get(SANDBOX_CLAIM, "alpha", namespace=ns)
    assert claim["spec"]["warmPoolRef"] == {"name": "shadow-pool-legacy"}

    async def not_found() -> dict[str, Any] | None:
        cond = ready_condition(await kube.get(SANDBOX_CLAIM, "alpha", namespace=ns))
        return cond if cond.get("reason") == c.REASON_WARM_POOL_NOT_FOUND else None

    cond = await eventually(not_found, "WarmPoolNotFound on the converted claim")
    assert cond["status"] == "False"
    assert cond["message"].startswith('SandboxWarmPool "shadow-pool-legacy" not found; ')
    assert 'a v1alpha1 claim that names SandboxTemplate "legacy" directly needs this pool' in cond["message"]
    assert "helm/files/migrate.sh --phase=bootstrap (docs/api-migration-guide.md)" in cond["message"]

    # --dry-run reads only.
    dry = migrate(cluster, "--phase=bootstrap", "--dry-run", f"--namespace={ns}")
    assert dry.returncode == 0, dry.stderr
    assert f"would create {ns}/shadow-pool-legacy" in dry.stdout
    assert "would create=1 " in dry.stdout
    assert await kube.list(SANDBOX_WARM_POOL, namespace=ns) == []

    # bootstrap: one pool for the three claims, none for the template no claim names.
    done = migrate(cluster, "--phase=bootstrap", f"--namespace={ns}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "created=1 exists=0" in done.stdout
    assert f'claim {ns}/delta names SandboxWarmPool "nowhere", which does not exist' in done.stderr

    async def delta_message() -> str:
        return str(ready_condition(await kube.get(SANDBOX_CLAIM, "delta", namespace=ns)).get("message", ""))

    # No migration hint for a pool that is not a shadow pool.
    await eventually(lambda: _eq(delta_message(), 'SandboxWarmPool "nowhere" not found'), "delta's message")
    pools = await kube.list(SANDBOX_WARM_POOL, namespace=ns)
    assert [p["metadata"]["name"] for p in pools] == ["shadow-pool-legacy"]
    (pool,) = pools
    assert pool["spec"] == {"replicas": 0, "sandboxTemplateRef": {"name": "legacy"}}
    annotations = pool["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_MIGRATION_SHADOW] == "true"
    assert annotations[c.ANNOTATION_MIGRATION_SOURCE_TEMPLATE] == "legacy"

    async def all_ready() -> bool:
        claims = [await kube.get(SANDBOX_CLAIM, n, namespace=ns) for n in ("alpha", "beta", "gamma")]
        return all(is_ready(cl) for cl in claims)

    await eventually(all_ready, "the three claims Ready after the bootstrap", within=90)

    # A rerun is a no-op.
    again = migrate(cluster, "--phase=bootstrap", f"--namespace={ns}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "created=0 exists=1" in again.stdout
    # (The pool controller writes the pool's status meanwhile; the script writes spec and metadata only.)
    rerun_pool = await kube.get(SANDBOX_WARM_POOL, "shadow-pool-legacy", namespace=ns)
    assert rerun_pool["spec"] == pool["spec"]
    assert rerun_pool["metadata"]["generation"] == pool["metadata"]["generation"]
    assert rerun_pool["metadata"]["annotations"] == pool["metadata"]["annotations"]
    assert rerun_pool["metadata"].get("labels") == pool["metadata"].get("labels")

    # --all-templates also covers the template no claim names yet.
    every = migrate(cluster, "--phase=bootstrap", "--all-templates", f"--namespace={ns}")
    assert every.returncode == 0, every.stdout + every.stderr
    assert "created=1 exists=1" in every.stdout
    unused = await kube.get(SANDBOX_WARM_POOL, "shadow-pool-unused", namespace=ns)
    assert unused["spec"]["replicas"] == 0

    # migrate --dry-run stamps nothing; migrate stamps every object of the four kinds, through v1beta1.
    objects = await stored(kube, ns)
    count = sum(len(v) for v in objects.values())
    assert len(objects["Sandbox"]) == 3
    dry = migrate(cluster, "--phase=migrate", "--dry-run", f"--namespace={ns}")
    assert dry.returncode == 0, dry.stderr
    assert f"would stamp={count} failures=0" in dry.stdout
    assert not any(
        c.ANNOTATION_STORAGE_MIGRATED_AT in (o["metadata"].get("annotations") or {})
        for by_name in (await stored(kube, ns)).values()
        for o in by_name.values()
    )
    done = migrate(cluster, "--phase=migrate", f"--namespace={ns}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"stamped={count} failures=0" in done.stdout
    after = await stored(kube, ns)
    for kind, by_name in after.items():
        for name, obj in by_name.items():
            stamp = (obj["metadata"].get("annotations") or {}).get(c.ANNOTATION_STORAGE_MIGRATED_AT)
            assert stamp, (kind, name)
    # The v1beta1-only status fields survive (a v1alpha1 write would have set nodeName to "" for a moment).
    for name, sandbox in after["Sandbox"].items():
        before_node = (objects["Sandbox"][name].get("status") or {}).get("nodeName")
        assert before_node, name
        assert (sandbox.get("status") or {}).get("nodeName") == before_node
    # A rerun is safe: it stamps (and so rewrites) every object again.
    await asyncio.sleep(1)  # a new second, a new stamp
    rerun = migrate(cluster, "--phase=migrate", f"--namespace={ns}")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"stamped={count} failures=0" in rerun.stdout
    stamp = after["SandboxTemplate"]["legacy"]["metadata"]["annotations"][c.ANNOTATION_STORAGE_MIGRATED_AT]
    restamped = await kube.get(SANDBOX_TEMPLATE, "legacy", namespace=ns)
    assert restamped["metadata"]["annotations"][c.ANNOTATION_STORAGE_MIGRATED_AT] > stamp


def test_usage_errors_exit_2(cluster: DevCluster) -> None:
    assert migrate(cluster).returncode == 2
    assert migrate(cluster, "--phase=sideways").returncode == 2
    assert migrate(cluster, "--phase=bootstrap", "--frobnicate").returncode == 2
    helped = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=False)
    assert helped.returncode == 0
    assert "--phase=bootstrap|migrate" in helped.stdout
