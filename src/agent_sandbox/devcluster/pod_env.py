"""A container's environment from its pod spec, as a kubelet builds it (pure): the dev cluster's local runner
gives it to the runtimes it runs and to the project's own pods' processes.

Kubelet's rules (`makeEnvironmentVariables`), in the order the entries are declared:

* `value` - `$(NAME)` references expanded against the entries declared before (an unknown one stays as
  written), `$$` an escaped `$`;
* an entry with neither `value` nor `valueFrom` - the API server stores `value: ""` so, `value` being
  omitempty - is set, empty (`E=`): a variable set to nothing, which `${E+set}` or `os.environ["E"]` tell
  from an unset one;
* `valueFrom.fieldRef` - the pod's name, namespace, UID, node, service account, pod and host IPs, and one
  label or annotation (`metadata.labels['k']`, empty when the pod has none of that name); not expanded.

Until December 7 the runner dropped an empty value, passed `$(A)` through literally and dropped the label and
annotation references (probe p1). Not reproduced: `envFrom`, `configMapKeyRef` / `secretKeyRef` /
`resourceFieldRef` (the runner reads no ConfigMaps or Secrets; such entries are left out) and the service
environment variables (`KUBERNETES_SERVICE_HOST`, ...; no Service here is reachable by them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["container_env", "expand"]

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


def container_env(pod: Pod, container: Mapping[str, Any]) -> dict[str, str]:
    """The variables `container`'s `env` declares, with their values as a kubelet gives them (module doc)."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        name = var.get("name")
        if not isinstance(name, str) or not name or "=" in name:
            continue
        value = var.get("value")
        source = var.get("valueFrom")
        if value:  # a non-empty value; an empty one with a valueFrom takes the valueFrom, as kubelet's
            env[name] = expand(str(value), env.get)
        elif source:
            ref = source.get("fieldRef")
            resolved = _field_ref(pod, str(ref.get("fieldPath", ""))) if ref else None
            if resolved is not None:  # a source the runner does not read is left out
                env[name] = resolved
        else:
            env[name] = ""
    return env


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
