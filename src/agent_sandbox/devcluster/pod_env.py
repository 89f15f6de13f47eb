"""A container's environment from its pod spec, as a kubelet builds it (pure): the dev cluster's local runner
gives it to the runtimes it runs and to the project's own pods' processes.

Kubelet's rules (`makeEnvironmentVariables`, Kubernetes 1.35):

* `envFrom` first, in the order declared: every key of each ConfigMap's `data` / Secret's `data` (base64
  decoded), with the entry's `prefix`; a later source overrides an earlier one. Keys are not filtered: the
  kubelet skipped names that are not C identifiers (with an `InvalidEnvironmentVariableNames` Event) until
  relaxed env var names (KEP-4369) removed that check; the API server admits no key or prefix with `=`.
* then `env`, in the order declared, overriding `envFrom`:
  - `value` - `$(NAME)` references expanded against everything set so far (`envFrom` included; an unknown one
    stays as written), `$$` an escaped `$`;
  - an entry with neither `value` nor `valueFrom` - the API server stores `value: ""` so, `value` being
    omitempty - is set, empty (`E=`): a variable set to nothing, which `${E+set}` or `os.environ["E"]` tell
    from an unset one;
  - `valueFrom.fieldRef` - the pod's name, namespace, UID, node, service account, pod and host IPs, and one
    label or annotation (`metadata.labels['k']`, empty when the pod has none of that name); not expanded;
  - `valueFrom.configMapKeyRef` / `secretKeyRef` - that key's value;
  - `valueFrom.resourceFieldRef` - a container's request or limit over the divisor, rounded up; a cpu,
    memory or ephemeral-storage limit the container does not set (or sets to 0) is the pod-level limit
    (`spec.resources.limits`, cpu and memory) or else the node's allocatable (`defaultPodLimitsForDownwardAPI`;
    an init container's, named by `containerName`, is not defaulted).
* a ConfigMap or Secret that does not exist, or a key it lacks, is an error - the container is not started
  (`CreateContainerConfigError`) - unless the reference is `optional`: a missing optional `envFrom` source
  adds nothing, a missing optional key leaves its variable as it was (unset, or what `envFrom` gave it).

`command` and `args` are expanded with the final environment (`expand_command`), as the kubelet's
`ExpandContainerCommandAndArgs`.

Until December 7 the runner dropped an empty value, passed `$(A)` through literally and dropped the label and
annotation references (probe p1); it ignored `envFrom`, Secret/ConfigMap/resource references and `$(VAR)` in
`command`/`args` until later that day. Not reproduced: the service environment variables
(`KUBERNETES_SERVICE_HOST`, ...; no Service here is reachable by them) and `fileKeyRef` (alpha `EnvFiles`).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

__all__ = [
    "ContainerConfigError",
    "EnvSources",
    "References",
    "container_env",
    "expand",
    "expand_command",
    "references",
]

Pod = Mapping[str, Any]

_OPERATOR, _OPENER, _CLOSER = "$", "(", ")"


def expand(value: str, mapping: Callable[[str], str | None]) -> str:
    """`value` with its `$(NAME)` references replaced by `mapping(NAME)` - kept as written where that is None -
    and `$$` by `$`: Kubernetes' `expansion.Expand` (third_party/forked/golang/expansion), which also reads a
    `$` before any other character, and a `$(` without its `)`, as written. Go's walks bytes and decodes the
    character after a `$` (`utf8.DecodeRuneInString`): on the valid UTF-8 the API server stores, the same."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(value):
        if value[cursor] == _OPERATOR and cursor + 1 < len(value):
            out.append(value[checkpoint:cursor])
            read, is_var, advance = _read_name(value[cursor + 1 :])
            if is_var:
                mapped = mapping(read)
                out.append(mapped if mapped is not None else f"{_OPERATOR}{_OPENER}{read}{_CLOSER}")
            else:
                out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + value[checkpoint:]


def _read_name(rest: str) -> tuple[str, bool, int]:
    """What follows a `$`: (the text to write or the name to map, whether it is a name, characters consumed) -
    Kubernetes' `tryReadVariableName`."""
    if rest[0] == _OPERATOR:  # `$$`: an escaped operator
        return _OPERATOR, False, 1
    if rest[0] == _OPENER:
        closer = rest.find(_CLOSER, 1)
        if closer != -1:
            return rest[1:closer], True, closer + 1
        return _OPERATOR + _OPENER, False, 1  # an unterminated reference, written as it is
    return _OPERATOR + rest[0], False, 1


class ContainerConfigError(Exception):
    """The container cannot be started: what a kubelet reports as the waiting reason
    `CreateContainerConfigError` (the message is the kubelet's, e.g. `configmap "c" not found`)."""


@dataclass(frozen=True, slots=True)
class EnvSources:
    """The objects a container's environment reads, fetched by the caller (`references` names them).

    `config_maps` / `secrets`: name -> the object, None (or absent) where it does not exist.
    `allocatable`: the node's `status.allocatable` (a limit the container does not set, for resourceFieldRef).
    """

    config_maps: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    allocatable: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class References:
    """What `container_env` will read: ConfigMap and Secret names, and whether the node's allocatable."""

    config_maps: frozenset[str]
    secrets: frozenset[str]
    node: bool


def references(container: Mapping[str, Any]) -> References:
    """The ConfigMaps and Secrets `container`'s `envFrom` / `env` refer to, and whether a resourceFieldRef
    may need the node (a limit the container does not set)."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    node = False
    for source in container.get("envFrom") or []:
        if source.get("configMapRef"):
            config_maps.add(str(source["configMapRef"].get("name", "")))
        elif source.get("secretRef"):
            secrets.add(str(source["secretRef"].get("name", "")))
    for var in container.get("env") or []:
        if var.get("value"):
            continue
        value_from = var.get("valueFrom") or {}
        if value_from.get("configMapKeyRef"):
            config_maps.add(str(value_from["configMapKeyRef"].get("name", "")))
        elif value_from.get("secretKeyRef"):
            secrets.add(str(value_from["secretKeyRef"].get("name", "")))
        elif value_from.get("resourceFieldRef"):
            node = True
    return References(frozenset(config_maps), frozenset(secrets), node)


def _secret_text(value: Any) -> str:
    """A Secret's `data` value as the process sees it: the decoded bytes (Go's `string(v)`); bytes that are
    not UTF-8 survive as surrogates, which `subprocess` encodes back to the same bytes."""
    return base64.b64decode(str(value)).decode("utf-8", "surrogateescape")


def _source_data(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    data = obj.get("data") or {}
    if kind == "secret":
        return {str(k): _secret_text(v) for k, v in data.items()}
    return {str(k): str(v) for k, v in data.items()}  # a ConfigMap's binaryData is not env (as kubelet's)


class _Lookup:
    """The ConfigMaps and Secrets a container reads, looked up with the kubelet's errors."""

    def __init__(self, namespace: str, sources: EnvSources) -> None:
        self.namespace = namespace
        self.objects = {"configmap": sources.config_maps, "secret": sources.secrets}

    def data(self, kind: str, name: str, *, optional: bool) -> dict[str, str] | None:
        """The object's data; None when it is missing and `optional`."""
        obj = self.objects[kind].get(name)
        if obj is None:
            if optional:
                return None
            raise ContainerConfigError(f'{kind} "{name}" not found')  # the API server's NotFound, as kubelet
        return _source_data(kind, obj)

    def key(self, kind: str, ref: Mapping[str, Any]) -> str | None:
        """The value of `ref`'s key; None when it (or its object) is missing and the reference `optional`."""
        name, key, optional = str(ref.get("name", "")), str(ref.get("key", "")), bool(ref.get("optional"))
        data = self.data(kind, name, optional=optional)
        if data is None:
            return None
        if key not in data:
            if optional:
                return None
            label = "ConfigMap" if kind == "configmap" else "Secret"
            raise ContainerConfigError(f"couldn't find key {key} in {label} {self.namespace}/{name}")
        return data[key]


def container_env(
    pod: Pod, container: Mapping[str, Any], sources: EnvSources | None = None
) -> dict[str, str]:
    """The variables `container`'s `envFrom` and `env` declare, with their values as a kubelet gives them
    (module doc).

    `sources`: the ConfigMaps, Secrets and node allocatable `references(container)` names; None: not read -
    `envFrom` and the entries that would read them are left out (the project's own pods, podprocess.py).

    Raises:
        ContainerConfigError: a ConfigMap, Secret or key that is not optional is missing, or a
            resourceFieldRef the kubelet refuses.
    """
    lookup = (
        _Lookup(str((pod.get("metadata") or {}).get("namespace", "")), sources)
        if sources is not None
        else None
    )
    env: dict[str, str] = {}
    if lookup is not None:
        for source in container.get("envFrom") or []:
            env.update(_env_from(source, lookup))
    for var in container.get("env") or []:
        name = var.get("name")
        if not isinstance(name, str) or not name or "=" in name:
            continue
        value = var.get("value")
        source = var.get("valueFrom")
        if value:  # a non-empty value; an empty one with a valueFrom takes the valueFrom, as kubelet's
            env[name] = expand(str(value), env.get)
        elif source:
            resolved = _value_from(pod, container, source, lookup, sources)
            if resolved is not None:  # an optional reference that is missing, or a source not read
                env[name] = resolved
        else:
            env[name] = ""
    return env


def _env_from(source: Mapping[str, Any], lookup: _Lookup) -> dict[str, str]:
    """One `envFrom` entry's variables: its ConfigMap's or Secret's keys with its prefix."""
    prefix = str(source.get("prefix") or "")
    for kind, ref in (("configmap", source.get("configMapRef")), ("secret", source.get("secretRef"))):
        if ref:
            data = lookup.data(kind, str(ref.get("name", "")), optional=bool(ref.get("optional")))
            # The API server admits no `=` in a key or prefix; one could not be set anyway.
            return {prefix + k: v for k, v in (data or {}).items() if "=" not in prefix + k}
    return {}


def _value_from(
    pod: Pod,
    container: Mapping[str, Any],
    source: Mapping[str, Any],
    lookup: _Lookup | None,
    sources: EnvSources | None,
) -> str | None:
    if source.get("fieldRef"):
        return _field_ref(pod, str(source["fieldRef"].get("fieldPath", "")))
    if lookup is None or sources is None:
        return None
    if source.get("configMapKeyRef"):
        return lookup.key("configmap", source["configMapKeyRef"])
    if source.get("secretKeyRef"):
        return lookup.key("secret", source["secretKeyRef"])
    if source.get("resourceFieldRef"):
        return _resource_field_ref(pod, container, source["resourceFieldRef"], sources.allocatable)
    return None


def expand_command(container: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """`command` and `args` with `$(NAME)` expanded from the container's final environment `env` (the
    output of `container_env`: not the image's variables nor the runtime's PATH/HOSTNAME), as the kubelet's
    `ExpandContainerCommandAndArgs`."""
    command = [expand(str(c), env.get) for c in container.get("command") or []]
    args = [expand(str(a), env.get) for a in container.get("args") or []]
    return command, args


_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$"
)
_SUFFIXES = {
    "m": Fraction(1, 1000),
    **{s: Fraction(10) ** (3 * (i + 1)) for i, s in enumerate("kMGTPE")},
    **{s: Fraction(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def _quantity(value: Any) -> Fraction:
    """A resource.Quantity's value (`500m`, `1Gi`, `1e3`); the API server admitted only valid ones."""
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise ContainerConfigError(f"invalid quantity {value!r}")
    number = Fraction(m.group(1))
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2))
    return number * _SUFFIXES[m.group(3)] if m.group(3) else number


#: The limits `MergeContainerResourceLimits` defaults when unset or zero (hugepages always have one).
_DEFAULTED_LIMITS = ("cpu", "memory", "ephemeral-storage")
#: `IsSupportedPodLevelResource` among those (PodLevelResources, beta and on by default since 1.34).
_POD_LEVEL_LIMITS = ("cpu", "memory")


def _limit_defaults(pod: Pod, allocatable: Mapping[str, Any]) -> dict[str, Any]:
    """What an unset container limit becomes (kubelet 1.35 `defaultPodLimitsForDownwardAPI`): the node's
    allocatable, where the pod sets a non-zero pod-level cpu or memory limit (`spec.resources.limits`) that
    limit instead - for a resource the allocatable lists."""
    defaults = dict(allocatable)
    pod_limits = (((pod.get("spec") or {}).get("resources")) or {}).get("limits") or {}
    for resource in _POD_LEVEL_LIMITS:
        value = pod_limits.get(resource)
        if value is not None and resource in defaults and _quantity(value) != 0:
            defaults[resource] = value
    return defaults


def _resource_field_ref(
    pod: Pod, container: Mapping[str, Any], ref: Mapping[str, Any], allocatable: Mapping[str, Any]
) -> str:
    """kubelet's `containerResourceRuntimeValue` on the container with its limits defaulted
    (`defaultPodLimitsForDownwardAPI`, `_limit_defaults`): ceil(value / divisor); CPU in whole millicores
    first, the rest in whole units first (Quantity's MilliValue and Value round up). A `containerName` may
    name an init container (`findContainerInPod`), whose limits the kubelet does not default."""
    target: Mapping[str, Any] = container
    defaulted = True
    name = ref.get("containerName")
    if name:
        spec = pod.get("spec") or {}
        containers: Sequence[Mapping[str, Any]] = spec.get("containers") or []
        init: Sequence[Mapping[str, Any]] = spec.get("initContainers") or []
        found = [c for c in containers if c.get("name") == name]
        found_init = [c for c in init if c.get("name") == name]
        if not found and not found_init:
            raise ContainerConfigError(f"container {name} not found")
        target, defaulted = (found[0], True) if found else (found_init[0], False)
    resource = str(ref.get("resource", ""))
    kind, _, resource_name = resource.partition(".")
    resources = target.get("resources") or {}
    if kind not in ("limits", "requests") or not (
        resource_name in ("cpu", "memory", "ephemeral-storage") or resource_name.startswith("hugepages-")
    ):
        raise ContainerConfigError(f"unsupported container resource : {resource}")
    amount = (resources.get(kind) or {}).get(resource_name)
    if (
        kind == "limits"
        and defaulted
        and resource_name in _DEFAULTED_LIMITS
        and (amount is None or _quantity(amount) == 0)
    ):
        amount = _limit_defaults(pod, allocatable).get(resource_name, amount)
    value = _quantity(amount) if amount is not None else Fraction(0)
    divisor = _quantity(ref.get("divisor") or 0) or Fraction(1)  # unset (zero): 1, as the kubelet's
    if resource_name == "cpu":
        return str(math.ceil(Fraction(math.ceil(value * 1000)) / math.ceil(divisor * 1000)))
    return str(math.ceil(Fraction(math.ceil(value)) / math.ceil(divisor)))


def _field_ref(pod: Pod, path: str) -> str | None:
    """The downward API value of `path` (kubelet's `podFieldSelectorRuntimeValue`); None for a path it does
    not support (the API server admits none in `env`)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if path.endswith("']") and "['" in path:  # metadata.labels['key'] (fieldpath.SplitMaybeSubscriptedPath)
        field, key = path[: -len("']")].split("['", 1)
        maps = {"metadata.labels": meta.get("labels"), "metadata.annotations": meta.get("annotations")}
        if field in maps:
            return str((maps[field] or {}).get(key, ""))
        return None
    pod_ips = [str(ip.get("ip", "")) for ip in status.get("podIPs") or []] or [str(status.get("podIP") or "")]
    host_ips = [str(ip.get("ip", "")) for ip in status.get("hostIPs") or []] or [
        str(status.get("hostIP") or "")
    ]
    values: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(pod_ips),
        "status.hostIP": status.get("hostIP"),
        "status.hostIPs": ",".join(host_ips),
    }
    if path not in values:
        return None
    value = values[path]
    return str(value) if value is not None else ""
