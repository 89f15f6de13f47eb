"""Round-trip conversion of every kind through the live webhook (api spec §8), incl. the quirks of §10."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import kinds, naming
from agent_sandbox.devcluster import DevCluster

if TYPE_CHECKING:
    from agent_sandbox.kube import ApiClient
    from tests.integration.api.conftest import LiveWebhook

pytestmark = pytest.mark.integration

POD = {"spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 8888}]}]}}
VCT = [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                               "resources": {"requests": {"storage": "1Gi"}}}}]  # fmt: skip
RESOURCE = {
    "Sandbox": "sandboxes.{v}.agents.x-k8s.io",
    "SandboxClaim": "sandboxclaims.{v}.extensions.agents.x-k8s.io",
    "SandboxTemplate": "sandboxtemplates.{v}.extensions.agents.x-k8s.io",
    "SandboxWarmPool": "sandboxwarmpools.{v}.extensions.agents.x-k8s.io",
}


class Api:
    """Thin kubectl wrapper for one namespace."""

    def __init__(self, cluster: DevCluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace

    def create(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("create", "-n", self.ns, "-f", "-", input=json.dumps(obj), check=True)

    def get(self, kind: str, version: str, name: str, *, managed_fields: bool = False) -> dict[str, Any]:
        extra = ["--show-managed-fields"] if managed_fields else []
        out = self.cluster.kubectl("get", RESOURCE[kind].format(v=version), name, "-n", self.ns, "-o", "json",
                                   *extra, check=True)  # fmt: skip
        obj: dict[str, Any] = json.loads(out.stdout)
        return obj

    def patch(
        self, kind: str, version: str, name: str, patch: dict[str, Any], *, status: bool = False
    ) -> None:
        extra = ["--subresource=status"] if status else []
        self.cluster.kubectl("patch", RESOURCE[kind].format(v=version), name, "-n", self.ns, "--type=merge",
                             "-p", json.dumps(patch), *extra, check=True)  # fmt: skip

    def replace(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("replace", "-n", self.ns, "-f", "-", input=json.dumps(obj), check=True)


@pytest.fixture
def api(webhook: LiveWebhook, namespace: str) -> Api:
    return Api(webhook.cluster, namespace)


def obj(api_version: str, kind: str, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, **meta}, "spec": spec}


def annotations(o: dict[str, Any]) -> dict[str, str]:
    return dict(o["metadata"].get("annotations") or {})


# (kind, v1alpha1 spec as created, expected v1beta1 spec subset, expected v1alpha1 spec read back)
ROUND_TRIPS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("Sandbox",
     {"podTemplate": POD, "replicas": 0, "volumeClaimTemplates": VCT, "service": True},
     {"operatingMode": "Suspended", "volumeClaimTemplates": VCT, "service": True, "shutdownPolicy": "Retain"},
     {"podTemplate": POD, "replicas": 0, "volumeClaimTemplates": VCT, "service": True, "shutdownPolicy": "Retain"}),
    ("Sandbox",
     {"podTemplate": POD, "shutdownTime": "2030-01-01T00:00:00Z", "shutdownPolicy": "Delete"},
     {"operatingMode": "Running", "shutdownTime": "2030-01-01T00:00:00Z", "shutdownPolicy": "Delete"},
     {"podTemplate": POD, "replicas": 1, "shutdownTime": "2030-01-01T00:00:00Z", "shutdownPolicy": "Delete"}),
    ("SandboxClaim",
     {"sandboxTemplateRef": {"name": "tmpl"}, "warmpool": "my-pool", "env": [{"name": "A", "value": "1"}],
      "lifecycle": {"shutdownPolicy": "Delete", "ttlSecondsAfterFinished": 60}},
     {"warmPoolRef": {"name": "my-pool"}, "env": [{"name": "A", "value": "1"}]},
     {"sandboxTemplateRef": {"name": "tmpl"}, "warmpool": "my-pool", "env": [{"name": "A", "value": "1"}],
      "lifecycle": {"shutdownPolicy": "Delete", "ttlSecondsAfterFinished": 60}}),
    ("SandboxClaim",  # cold-start claim with the default policy -> shadow pool
     {"sandboxTemplateRef": {"name": "tmpl"}},
     {"warmPoolRef": {"name": "shadow-pool-tmpl"}},
     {"sandboxTemplateRef": {"name": "tmpl"}, "warmpool": "default"}),
    ("SandboxTemplate",
     {"podTemplate": POD, "networkPolicy": {"egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]},
      "envVarsInjectionPolicy": "Overrides"},
     {"envVarsInjectionPolicy": "Overrides", "networkPolicyManagement": "Managed",
      "volumeClaimTemplatesPolicy": "Disallowed"},
     {"podTemplate": POD, "networkPolicy": {"egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]},
      "envVarsInjectionPolicy": "Overrides", "networkPolicyManagement": "Managed"}),
    ("SandboxWarmPool",
     {"replicas": 3, "sandboxTemplateRef": {"name": "tmpl"}, "updateStrategy": {"type": "Recreate"}},
     {"replicas": 3, "sandboxTemplateRef": {"name": "tmpl"}, "updateStrategy": {"type": "Recreate"}},
     {"replicas": 3, "sandboxTemplateRef": {"name": "tmpl"}, "updateStrategy": {"type": "Recreate"}}),
]  # fmt: skip


def _pod_with_tcp(spec: dict[str, Any]) -> dict[str, Any]:
    """The API server defaults `protocol: TCP` on container ports (embedded PodSpec schema)."""
    text = json.dumps(spec).replace('{"containerPort": 8888}', '{"containerPort": 8888, "protocol": "TCP"}')
    out: dict[str, Any] = json.loads(text)
    return out


@pytest.mark.parametrize(
    ("kind", "alpha_spec", "beta_subset", "alpha_back"),
    ROUND_TRIPS,
    ids=[f"{k}-{i}" for i, (k, *_rest) in enumerate(ROUND_TRIPS)],
)
def test_create_as_v1alpha1_read_as_v1beta1_and_back(
    api: Api, kind: str, alpha_spec: dict[str, Any], beta_subset: dict[str, Any], alpha_back: dict[str, Any]
) -> None:
    group = kinds.KINDS_BY_NAME[kind].group
    api.create(obj(f"{group}/v1alpha1", kind, "rt", alpha_spec, labels={"keep": "me"}))

    beta = api.get(kind, "v1beta1", "rt")
    assert beta["apiVersion"] == f"{group}/v1beta1"
    for key, value in beta_subset.items():
        assert beta["spec"][key] == value, key
    assert beta["metadata"]["labels"] == {"keep": "me"}
    state = json.loads(annotations(beta)[c.STATE_ANNOTATIONS[kind]])  # visible to v1beta1 readers (quirk 3)
    # ours: only what the way back reads (docs/design/api-quirks.md, "Snapshot contents"), as defaulted
    read_back = {"Sandbox": ("replicas",), "SandboxClaim": ("sandboxTemplateRef", "warmpool")}.get(kind, ())
    assert state == {"apiVersion": f"{group}/v1alpha1", "kind": kind,
                     "spec": {k: alpha_back[k] for k in read_back if k in alpha_back}}  # fmt: skip

    alpha = api.get(kind, "v1alpha1", "rt")
    assert alpha["apiVersion"] == f"{group}/v1alpha1"
    assert alpha["spec"] == _pod_with_tcp(alpha_back)
    assert c.STATE_ANNOTATIONS[kind] not in annotations(alpha)
    # The webhook answers with name, namespace, uid, labels and annotations only; the API server restores
    # the rest of the metadata from the stored object (docs/design/webhook-answer-metadata.md).
    restored = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")
    alpha_meta = api.get(kind, "v1alpha1", "rt", managed_fields=True)["metadata"]
    beta_meta = api.get(kind, "v1beta1", "rt", managed_fields=True)["metadata"]
    assert alpha_meta["managedFields"]
    assert {k: alpha_meta.get(k) for k in restored} == {k: beta_meta.get(k) for k in restored}

    # ... and back: writing the unchanged v1alpha1 object is lossless and leaves the stored
    # v1beta1 object as it was (same spec, same snapshot, no new generation).
    before = api.get(kind, "v1beta1", "rt")
    api.replace(alpha)
    assert api.get(kind, "v1alpha1", "rt")["spec"] == alpha["spec"]
    after = api.get(kind, "v1beta1", "rt")
    assert after["spec"] == before["spec"]
    assert annotations(after) == annotations(before)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def test_v1beta1_mode_edits_show_up_as_v1alpha1_replicas(api: Api) -> None:
    api.create(obj(c.SANDBOX_API_VERSION_V1ALPHA1, "Sandbox", "flip", {"podTemplate": POD, "replicas": 1}))
    api.patch("Sandbox", "v1beta1", "flip", {"spec": {"operatingMode": "Suspended"}})
    alpha = api.get("Sandbox", "v1alpha1", "flip")
    assert alpha["spec"]["replicas"] == 0
    api.patch("Sandbox", "v1beta1", "flip", {"spec": {"operatingMode": "Running"}})
    assert api.get("Sandbox", "v1alpha1", "flip")["spec"]["replicas"] == 1
    # the snapshot is stale after v1beta1 edits but still there (quirk 3)
    assert c.ANNOTATION_V1ALPHA1_SANDBOX_STATE in annotations(api.get("Sandbox", "v1beta1", "flip"))


def test_status_replicas_is_synthesised(api: Api) -> None:
    """Quirk 8: v1alpha1 status.replicas comes from the mode, not from a Pod."""
    api.create(obj(c.SANDBOX_API_VERSION, "Sandbox", "syn", {"podTemplate": POD}))
    assert api.get("Sandbox", "v1alpha1", "syn")["status"]["replicas"] == 1
    api.patch("Sandbox", "v1beta1", "syn", {"status": {"nodeName": "kwok-node-0", "podIPs": ["10.0.0.7"]}},
              status=True)  # fmt: skip
    alpha = api.get("Sandbox", "v1alpha1", "syn")
    assert alpha["status"] == {"podIPs": ["10.0.0.7"], "replicas": 1}  # nodeName is v1beta1-only


def test_v1alpha1_scale_subresource_suspends_sandbox(api: Api) -> None:
    api.create(obj(c.SANDBOX_API_VERSION, "Sandbox", "scaled", {"podTemplate": POD}))
    cluster, ns = api.cluster, api.ns
    cluster.kubectl(
        "scale", "sandboxes.v1alpha1.agents.x-k8s.io/scaled", "-n", ns, "--replicas=0", check=True
    )
    assert api.get("Sandbox", "v1beta1", "scaled")["spec"]["operatingMode"] == "Suspended"
    raw = cluster.kubectl("get", "--raw", f"/apis/agents.x-k8s.io/v1alpha1/namespaces/{ns}/sandboxes/scaled/scale",
                          check=True)  # fmt: skip
    scale = json.loads(raw.stdout)
    assert scale["kind"] == "Scale"
    assert scale["spec"].get("replicas", 0) == 0  # autoscaling/v1 omits a zero spec.replicas
    assert scale["status"]["replicas"] == 0  # synthesised from Suspended, not pinned by the snapshot
    cluster.kubectl(
        "scale", "sandboxes.v1alpha1.agents.x-k8s.io/scaled", "-n", ns, "--replicas=1", check=True
    )
    assert api.get("Sandbox", "v1beta1", "scaled")["spec"]["operatingMode"] == "Running"
    cluster.kubectl(
        "scale", "sandboxes.v1alpha1.agents.x-k8s.io/scaled", "-n", ns, "--replicas=0", check=True
    )
    # v1beta1 Sandbox has no scale subresource; the unqualified resource resolves to v1beta1
    out = cluster.kubectl("scale", "sandbox/scaled", "-n", ns, "--replicas=1")
    assert out.returncode != 0
    assert api.get("Sandbox", "v1beta1", "scaled")["spec"]["operatingMode"] == "Suspended"


def test_v1beta1_claim_quirks(api: Api) -> None:
    """Quirk 2 (template name guessed from the pool) and lossy volumeClaimTemplates."""
    spec = {"warmPoolRef": {"name": "pool-x"}, "volumeClaimTemplates": VCT, "additionalPodMetadata": {}}
    api.create(obj(c.EXTENSIONS_API_VERSION, "SandboxClaim", "q", spec))
    alpha = api.get("SandboxClaim", "v1alpha1", "q")
    assert alpha["spec"]["warmpool"] == "pool-x"
    assert alpha["spec"]["sandboxTemplateRef"] == {"name": "pool-x"}
    assert "volumeClaimTemplates" not in alpha["spec"]
    assert api.get("SandboxClaim", "v1beta1", "q")["spec"]["volumeClaimTemplates"] == VCT  # storage untouched


def test_template_policy_travels_in_an_annotation(api: Api) -> None:
    spec = {"podTemplate": POD, "volumeClaimTemplatesPolicy": "Overrides"}
    api.create(obj(c.EXTENSIONS_API_VERSION, "SandboxTemplate", "pol", spec))
    alpha = api.get("SandboxTemplate", "v1alpha1", "pol")
    assert annotations(alpha)[c.ANNOTATION_V1BETA1_VCT_POLICY] == "Overrides"
    assert "volumeClaimTemplatesPolicy" not in alpha["spec"]

    alpha["metadata"]["annotations"][c.ANNOTATION_V1BETA1_VCT_POLICY] = "Allowed"
    api.replace(alpha)
    beta = api.get("SandboxTemplate", "v1beta1", "pol")
    assert beta["spec"]["volumeClaimTemplatesPolicy"] == "Allowed"
    assert c.ANNOTATION_V1BETA1_VCT_POLICY not in annotations(beta)


def test_invalid_policy_annotation_fails_conversion(api: Api) -> None:
    bad = obj(c.EXTENSIONS_API_VERSION_V1ALPHA1, "SandboxTemplate", "badpol", {"podTemplate": POD},
              annotations={c.ANNOTATION_V1BETA1_VCT_POLICY: "Sometimes"})  # fmt: skip
    out = api.cluster.kubectl("create", "-n", api.ns, "-f", "-", input=json.dumps(bad))
    assert out.returncode != 0
    assert "invalid VolumeClaimTemplatesPolicy annotation value" in out.stderr


def test_warm_pool_observed_generation_is_v1beta1_only(api: Api) -> None:
    api.create(obj(c.EXTENSIONS_API_VERSION, "SandboxWarmPool", "wp", {"sandboxTemplateRef": {"name": "t"}}))
    status = {
        "replicas": 2,
        "readyReplicas": 1,
        "selector": naming.warm_pool_selector("wp"),
        "observedGeneration": 1,
    }
    api.patch("SandboxWarmPool", "v1beta1", "wp", {"status": status}, status=True)
    alpha = api.get("SandboxWarmPool", "v1alpha1", "wp")
    assert alpha["spec"]["replicas"] == 1  # v1beta1 default
    assert alpha["status"] == {"replicas": 2, "readyReplicas": 1, "selector": naming.warm_pool_selector("wp")}


def test_deprecation_warning_is_returned(api: Api) -> None:
    api.create(
        obj(c.EXTENSIONS_API_VERSION, "SandboxWarmPool", "warn", {"sandboxTemplateRef": {"name": "t"}})
    )
    out = api.cluster.kubectl("get", RESOURCE["SandboxWarmPool"].format(v="v1alpha1"), "warn", "-n", api.ns,
                              check=True)  # fmt: skip
    assert ("Warning: extensions.agents.x-k8s.io/v1alpha1 SandboxWarmPool is deprecated; use "
            "extensions.agents.x-k8s.io/v1beta1 SandboxWarmPool instead") in out.stderr  # fmt: skip


async def test_async_client_reads_both_versions(api: Api, kube: ApiClient) -> None:
    from agent_sandbox.api import Sandbox, v1alpha1
    from agent_sandbox.kube import SANDBOX, SANDBOX_V1ALPHA1

    api.create(obj(c.SANDBOX_API_VERSION_V1ALPHA1, "Sandbox", "typed", {"podTemplate": POD, "replicas": 0}))
    beta = Sandbox.from_dict(await kube.get(SANDBOX, "typed", namespace=api.ns))
    assert beta.spec.operating_mode is c.OperatingMode.SUSPENDED
    alphas = await kube.list(SANDBOX_V1ALPHA1, namespace=api.ns)
    assert [v1alpha1.Sandbox.from_dict(o).spec.replicas for o in alphas] == [0]


def test_an_unusable_snapshot_does_not_take_down_the_v1alpha1_view(api: Api) -> None:
    """Ours (upstream's webhook fails the conversion): anyone who may edit the v1beta1 object can write the
    snapshot annotation. Until December 6 one bad value failed every v1alpha1 LIST of the namespace, and a
    value of the wrong type came back against the v1alpha1 schema (the /scale subresource failed on it)."""
    api.create(obj(c.SANDBOX_API_VERSION, "Sandbox", "bad-state", {"podTemplate": POD}))
    api.create(obj(c.SANDBOX_API_VERSION, "Sandbox", "neighbour", {"podTemplate": POD}))
    state = c.ANNOTATION_V1ALPHA1_SANDBOX_STATE
    api.patch("Sandbox", "v1beta1", "bad-state", {"metadata": {"annotations": {state: "{not json"}}})
    listed = api.cluster.kubectl(
        "get", RESOURCE["Sandbox"].format(v="v1alpha1"), "-n", api.ns, "-o", "json", check=True
    )
    assert {o["metadata"]["name"] for o in json.loads(listed.stdout)["items"]} == {"bad-state", "neighbour"}
    typed = json.dumps({"spec": {"replicas": "abc"}, "status": {"replicas": -5}})
    api.patch("Sandbox", "v1beta1", "bad-state", {"metadata": {"annotations": {state: typed}}})
    alpha = api.get("Sandbox", "v1alpha1", "bad-state")
    assert (alpha["spec"]["replicas"], alpha["status"]["replicas"]) == (1, 1)


NESTED = "[" * 300 + "]" * 300
HOSTILE_SANDBOX_STATES = [
    '{"spec":{"replicas":1},"status":{"replicas":99999999999999999999999}}',  # beyond int64
    '{"spec":{"replicas":1},"status":{"replicas":5000000000}}',  # beyond int32: /scale showed it cut
    '{"spec":' + "[" * 3000 + "]" * 3000 + "}",  # RecursionError in the webhook's JSON parser
]
HOSTILE_CLAIM_STATES = [
    '{"spec":{"sandboxTemplateRef":{"name":"\\ud800"}}}',  # a lone surrogate the answer cannot encode
    '{"spec":{"sandboxTemplateRef":{"name":"t","x":' + NESTED + "}}}",  # deeper than orjson writes
]


def test_hostile_snapshots_do_not_take_down_the_v1alpha1_lists(api: Api) -> None:
    """The probe: each of these annotations made the webhook answer 500 for every v1alpha1 list of the kind in
    the namespace (and kept the API server's v1alpha1 watch cache retrying, ~600 tracebacks in 40 s)."""
    api.create(obj(c.SANDBOX_API_VERSION, "Sandbox", "sb1", {"podTemplate": POD}))
    api.create(obj(c.SANDBOX_API_VERSION, "Sandbox", "sb2", {"podTemplate": POD}))
    api.create(
        obj(c.EXTENSIONS_API_VERSION, "SandboxClaim", "cl1", {"warmPoolRef": {"name": "shadow-pool-t"}})
    )
    api.create(
        obj(c.EXTENSIONS_API_VERSION, "SandboxClaim", "cl2", {"warmPoolRef": {"name": "shadow-pool-t"}})
    )
    for kind, name, states in (("Sandbox", "sb1", HOSTILE_SANDBOX_STATES),
                               ("SandboxClaim", "cl1", HOSTILE_CLAIM_STATES)):  # fmt: skip
        for state in states:
            api.patch(
                kind, "v1beta1", name, {"metadata": {"annotations": {c.STATE_ANNOTATIONS[kind]: state}}}
            )
            listed = api.cluster.kubectl(
                "get", RESOURCE[kind].format(v="v1alpha1"), "-n", api.ns, "-o", "json", check=True
            )
            items = {o["metadata"]["name"]: o for o in json.loads(listed.stdout)["items"]}
            assert set(items) == ({"sb1", "sb2"} if kind == "Sandbox" else {"cl1", "cl2"}), state[:80]
            if kind == "Sandbox":
                assert items["sb1"]["status"]["replicas"] == 1, state[:80]
            else:
                assert items["cl1"]["spec"]["sandboxTemplateRef"] == {"name": "t"}, state[:80]
    scale = api.cluster.kubectl(
        "get", "--raw", f"/apis/agents.x-k8s.io/v1alpha1/namespaces/{api.ns}/sandboxes/sb1/scale", check=True
    )
    assert json.loads(scale.stdout)["status"]["replicas"] == 1


def test_a_v1alpha1_status_write_does_not_move_the_warm_pool(api: Api) -> None:
    """The probe: on a v1alpha1 /status write the API server converts the stored spec with the client's status;
    rule (b) of api §8.4 read status.sandbox.name, so the write rewrote spec.warmPoolRef (generation 1)."""
    api.create(
        obj(
            c.EXTENSIONS_API_VERSION_V1ALPHA1, "SandboxClaim", "cold", {"sandboxTemplateRef": {"name": "tpl"}}
        )
    )
    # what the controller writes (through v1beta1) for a cold start: the Sandbox named like the claim
    api.patch("SandboxClaim", "v1beta1", "cold", {"status": {"sandbox": {"name": "cold"}}}, status=True)
    before = api.get("SandboxClaim", "v1beta1", "cold")
    assert before["spec"]["warmPoolRef"] == {"name": "shadow-pool-tpl"}

    alpha = api.get("SandboxClaim", "v1alpha1", "cold")
    alpha["status"] = {"sandbox": {"name": "other-pool-abcde"}}
    api.cluster.kubectl("replace", "--subresource=status", "-n", api.ns, "-f", "-", input=json.dumps(alpha),
                        check=True)  # fmt: skip
    after = api.get("SandboxClaim", "v1beta1", "cold")
    assert after["status"]["sandbox"] == {"name": "other-pool-abcde"}  # the status write happened
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"] == 1
    assert api.get("SandboxClaim", "v1alpha1", "cold")["spec"]["sandboxTemplateRef"] == {"name": "tpl"}


def test_a_recorded_warm_start_still_maps_to_its_pool(api: Api) -> None:
    """Rule (b) kept for what it exists for (upstream-compatible): a warm-started v1alpha1 claim - recorded in
    its assignment annotation, as the claim controller does - converts to the pool its Sandbox came from, and
    a status write cannot change that either."""
    api.create(obj(c.EXTENSIONS_API_VERSION_V1ALPHA1, "SandboxClaim", "warm", {"sandboxTemplateRef": {"name": "tpl"}},
                   annotations={c.ANNOTATION_SANDBOX_NAME: "fast-pool-x1y2z"}))  # fmt: skip
    beta = api.get("SandboxClaim", "v1beta1", "warm")
    assert beta["spec"]["warmPoolRef"] == {"name": "fast-pool"}
    alpha = api.get("SandboxClaim", "v1alpha1", "warm")
    assert alpha["spec"] == {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "default"}
    for status in ({"sandbox": {"name": "warm"}}, {}):
        alpha = api.get("SandboxClaim", "v1alpha1", "warm")
        alpha["status"] = status
        api.cluster.kubectl("replace", "--subresource=status", "-n", api.ns, "-f", "-", input=json.dumps(alpha),
                            check=True)  # fmt: skip
        assert api.get("SandboxClaim", "v1beta1", "warm")["spec"]["warmPoolRef"] == {"name": "fast-pool"}


def test_a_large_v1alpha1_object_is_accepted_as_v1beta1_is(api: Api) -> None:
    """The probe: 150 env vars of 1 KB applied as v1alpha1 failed ("metadata.annotations: Too long: may not be
    more than 262144 bytes": the whole-spec snapshot plus kubectl's last-applied copy) where v1beta1 accepts."""
    env = [{"name": f"VAR_{i}", "value": "x" * 1024} for i in range(150)]
    pod = {"spec": {"containers": [{"name": "c", "image": "busybox", "env": env}]}}
    manifest = obj(c.SANDBOX_API_VERSION_V1ALPHA1, "Sandbox", "big", {"podTemplate": pod, "replicas": 0})
    api.cluster.kubectl("apply", "-n", api.ns, "-f", "-", input=json.dumps(manifest), check=True)
    alpha = api.get("Sandbox", "v1alpha1", "big")
    assert alpha["spec"]["podTemplate"]["spec"]["containers"][0]["env"] == env
    assert alpha["spec"]["replicas"] == 0
    before = api.get("Sandbox", "v1beta1", "big")
    assert before["spec"]["operatingMode"] == "Suspended"
    api.cluster.kubectl("apply", "-n", api.ns, "-f", "-", input=json.dumps(manifest), check=True)
    after = api.get("Sandbox", "v1beta1", "big")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert annotations(after) == annotations(before)
