"""Pure parser for the Prometheus text exposition format (what the controller serves on /metrics).

Only what the harness reads: samples with their labels, histograms summed across label sets (the KWOK
gate sums the claim-latency histogram across `launch_type` and `sandbox_template`), and counters summed by
one label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Sample", "apiserver_requests", "counter_by", "counter_by_labels", "histogram", "parse", "scalar"]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def _parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in ", ":
            i += 1
        if i >= n:
            break
        eq = text.index("=", i)
        key = text[i:eq].strip()
        i = eq + 1
        if text[i] != '"':
            raise ValueError(f"label {key!r}: value not quoted")
        i += 1
        out: list[str] = []
        while text[i] != '"':
            if text[i] == "\\":
                nxt = text[i + 1]
                out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, nxt))
                i += 2
            else:
                out.append(text[i])
                i += 1
        labels[key] = "".join(out)
        i += 1
    return labels


def _value(text: str) -> float:
    text = text.strip()
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    return float(text)


def parse(text: str) -> list[Sample]:
    """All samples of an exposition (comments and blank lines skipped; timestamps ignored)."""
    samples: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            label_text, tail = rest.rsplit("}", 1)
            labels = _parse_labels(label_text)
        else:
            name, _, tail = line.partition(" ")
            labels = {}
        value_text = tail.split()[0]
        samples.append(Sample(name.strip(), labels, _value(value_text)))
    return samples


def _matches(sample: Sample, labels: Mapping[str, str]) -> bool:
    return all(sample.labels.get(k) == v for k, v in labels.items())


def histogram(samples: list[Sample], name: str, /, **labels: str) -> list[tuple[float, float]]:
    """Cumulative buckets of histogram `name` summed over every label set matching `labels` ([] if none)."""
    summed: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket" and "le" in s.labels and _matches(s, labels):
            le = _value(s.labels["le"])
            summed[le] = summed.get(le, 0.0) + s.value
    return sorted(summed.items())


def counter_by(samples: list[Sample], name: str, label: str) -> dict[str, float]:
    """Counter `name` (with or without the `_total` suffix) summed per value of `label`."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name in (name, f"{name}_total"):
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
    return out


def scalar(samples: list[Sample], name: str, /, **labels: str) -> float | None:
    """Sum of the samples of `name` whose labels include `labels` (None when none match)."""
    matched = [s.value for s in samples if s.name == name and _matches(s, labels)]
    return sum(matched) if matched else None


def counter_by_labels(samples: list[Sample], name: str, labels: tuple[str, ...]) -> dict[str, float]:
    """Counter `name` summed per combination of `labels`, keyed "v1 v2/v3"-style (values joined by space)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name in (name, f"{name}_total"):
            key = " ".join(s.labels.get(label, "") for label in labels).strip()
            out[key] = out.get(key, 0.0) + s.value
    return out


def apiserver_requests(samples: list[Sample], verbs: tuple[str, ...]) -> dict[str, float]:
    """kube-apiserver's `apiserver_request_total` for `verbs`, summed over codes: "VERB resource[/subresource]"
    ("-" for a non-resource path). Every client's requests, reads included (the audit policy skips those)."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name == "apiserver_request_total" and s.labels.get("verb") in verbs:
            sub = s.labels.get("subresource") or ""
            key = f"{s.labels['verb']} {s.labels.get('resource') or '-'}{'/' + sub if sub else ''}"
            out[key] = out.get(key, 0.0) + s.value
    return out
