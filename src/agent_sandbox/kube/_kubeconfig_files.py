"""Reading kubeconfig files as client-go's loading rules do: a `$KUBECONFIG` list merged into one config.

Owns: splitting `$KUBECONFIG`, reading each file, resolving its relative file references against that file's
own directory, and merging the files into one kubeconfig dict for lightkube's `KubeConfig.from_dict`. Does not
own interpreting the result (`_config`).

Merge rules (client-go `ClientConfigLoadingRules.Load`, checked against kubectl 1.35): the first file that
defines a cluster, user or context name supplies that whole entry (entries are never merged field by field);
the first file that sets a non-empty `current-context` wins; `$KUBECONFIG` entries that are not files are
skipped. Relative paths are resolved before merging because after it nothing records which file an entry
came from (client-go keeps a `LocationOfOrigin` per entry for the same reason).

Failure modes: an unreadable or malformed file raises `ConfigError` naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ._config import ConfigError

__all__ = ["existing_files", "merge_files", "named_entry"]

# (list key, key of the entry's body) of each named section.
_SECTIONS = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))
# client-go's GetClusterFileReferences / GetAuthInfoFileReferences.
_FILE_FIELDS = {
    "clusters": ("certificate-authority",),
    "users": ("client-certificate", "client-key", "tokenFile"),
}


def existing_files(kubeconfig_env: str) -> list[Path]:
    """The entries of a `$KUBECONFIG` value that are files, in order, `~` expanded, duplicates dropped."""
    files: list[Path] = []
    for entry in kubeconfig_env.split(os.pathsep):
        path = Path(entry).expanduser()
        if entry and path.is_file() and path not in files:
            files.append(path)
    return files


def merge_files(paths: Sequence[Path]) -> dict[str, Any]:
    """Read and merge kubeconfig files (earlier files take precedence), every file path made absolute.

    Raises:
        ConfigError: a file cannot be read or is not a kubeconfig.
    """
    merged: dict[str, Any] = {section: [] for section, _ in _SECTIONS}
    seen: dict[str, set[str]] = {section: set() for section, _ in _SECTIONS}
    for path in paths:
        doc = _read(path)
        base = Path(os.path.abspath(path)).parent
        for section, body_key in _SECTIONS:
            entries = doc.get(section) or []
            if not isinstance(entries, list):
                raise ConfigError(f"kubeconfig {path}: {section} must be a list")
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise ConfigError(f"kubeconfig {path}: every entry of {section} needs a name")
                if entry["name"] in seen[section]:
                    continue
                seen[section].add(entry["name"])
                body = entry.get(body_key)
                if isinstance(body, dict):
                    merged[section].append({**entry, body_key: _resolve_paths(section, body, base)})
                else:
                    merged[section].append(entry)
        if not merged.get("current-context") and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
    return merged


def named_entry(merged: Mapping[str, Any], section: str, name: str) -> dict[str, Any]:
    """The body of entry `name` in `section` ("clusters", "users", "contexts"); {} when absent."""
    body_key = dict(_SECTIONS)[section]
    for entry in merged.get(section) or []:
        if entry.get("name") == name:
            body = entry.get(body_key)
            return body if isinstance(body, dict) else {}
    return {}


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"kubeconfig {path}: invalid YAML: {exc}") from exc
    if doc is None:  # client-go treats an empty file as an empty config
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig (want a mapping at the top level)")
    return doc


def _resolve_paths(section: str, body: dict[str, Any], base: Path) -> dict[str, Any]:
    body = dict(body)
    for field in _FILE_FIELDS.get(section, ()):
        value = body.get(field)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[field] = os.path.normpath(base / value)
    exec_ = body.get("exec")
    if section == "users" and isinstance(exec_, dict):
        command = exec_.get("command")
        # A bare name ("gke-gcloud-auth-plugin") is looked up on PATH; only a command with a separator is a
        # path, and then one relative to the kubeconfig, not to wherever the controller was started.
        if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
            body["exec"] = {**exec_, "command": os.path.normpath(base / command)}
    return body
