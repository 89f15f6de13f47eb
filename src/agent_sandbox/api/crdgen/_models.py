"""Derive structural OpenAPI schemas from the pydantic API models.

Field names come from the aliases, types from the annotations, ``required`` from fields
without a default, ``default`` from plain (non-factory, non-None) Python defaults, and
everything else from :class:`agent_sandbox.api._schema.Schema` hints. Embedded Kubernetes
types (``dict[str, Any]`` with a ``k8s_ref`` hint) are inlined from the OpenAPI snapshot.
"""

from __future__ import annotations

import enum
import types
import typing
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agent_sandbox.api._common import ObjectMeta
from agent_sandbox.api._schema import Schema, find_schema
from agent_sandbox.api.crdgen._k8s import k8s_schema

JSONSchema = dict[str, Any]


def model_schema(model: type[BaseModel]) -> JSONSchema:
    """Structural schema of a pydantic model (an object with sorted ``required``)."""
    props: JSONSchema = {}
    required: list[str] = []
    for name, field in model.model_fields.items():
        wire = field.alias or name
        schema = _annotation_schema(field.annotation, list(field.metadata))
        default = field.default
        if default is not PydanticUndefined and default is not None and field.default_factory is None:
            schema["default"] = default.value if isinstance(default, enum.Enum) else default
        if field.is_required():
            required.append(wire)
        props[wire] = schema
    out: JSONSchema = {"properties": props, "type": "object"}
    if required:
        out["required"] = sorted(required)
    return out


def _annotation_schema(annotation: Any, hints: list[Any]) -> JSONSchema:
    """Schema for a type annotation; ``hints`` are Schema markers collected on the way down."""
    hints = list(hints)
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *meta = typing.get_args(annotation)
            hints.extend(meta)
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                raise TypeError(f"unsupported union {annotation!r}")
            annotation = members[0]
        else:
            break
    hint = find_schema(hints)
    schema = _base_schema(annotation, hint)
    _apply_hint(schema, hint)
    return schema


def _base_schema(annotation: Any, hint: Schema) -> JSONSchema:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if hint.k8s_ref:
        return k8s_schema(hint.k8s_ref)
    if isinstance(annotation, type):
        if annotation is ObjectMeta:
            return {"type": "object"}
        if issubclass(annotation, BaseModel):
            return model_schema(annotation)
        if issubclass(annotation, enum.Enum):
            return {"enum": [m.value for m in annotation], "type": "string"}
        if annotation is bool:
            return {"type": "boolean"}
        if annotation is int:
            return {"type": "integer"}
        if annotation is str:
            return {"type": "string"}
        if annotation is datetime:
            return {"format": "date-time", "type": "string"}
    if origin is list:
        return {"items": _annotation_schema(args[0], []), "type": "array"}
    if origin is dict and args[0] is str and args[1] is str:
        return {"additionalProperties": {"type": "string"}, "type": "object"}
    raise TypeError(f"no CRD schema mapping for {annotation!r}")


def _apply_hint(schema: JSONSchema, hint: Schema) -> None:
    for attr, key in (
        ("format", "format"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("min_length", "minLength"),
        ("max_length", "maxLength"),
        ("pattern", "pattern"),
        ("list_type", "x-kubernetes-list-type"),
    ):
        value = getattr(hint, attr)
        if value is not None:
            schema[key] = value
    if hint.validations:
        schema["x-kubernetes-validations"] = [
            {"message": msg, "rule": rule} for rule, msg in hint.validations
        ]
