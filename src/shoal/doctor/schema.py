"""The JSON schema (draft 2020-12) of ``shoal doctor --json``; docs/DOCTOR.md shows it, the tests validate
every document the doctor prints against it."""

from __future__ import annotations

from typing import Any

from shoal.doctor.report import SCHEMA_ID

_STATUS = {"enum": ["ok", "warn", "fail"]}
_CHECK = {
    "type": "object",
    "required": ["name", "status", "summary", "hint", "data"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"},
        "status": _STATUS,
        "summary": {"type": "string", "minLength": 1},
        "hint": {"type": ["string", "null"]},
        "data": {"type": "object"},
    },
    # Every check that is not ok says how to fix it.
    "if": {"properties": {"status": {"enum": ["warn", "fail"]}}},
    "then": {"properties": {"hint": {"type": "string", "minLength": 1}}},
}
_PLAN = {
    "type": ["object", "null"],
    "required": ["backend", "endpoint", "hosts_store", "store_port", "bind_addr", "interface", "advertise", "environ"],
    "properties": {
        "backend": {"enum": ["static", "c10d"]},
        "endpoint": {"type": "string"},
        "hosts_store": {"type": "boolean"},
        "store_port": {"type": ["integer", "null"]},
        "bind_addr": {"type": "string"},
        "interface": {"type": ["string", "null"]},
        "advertise": {"type": "string"},
        "environ": {"type": "object", "additionalProperties": {"type": "string"}},
        "node_rank": {"type": ["integer", "null"]},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
}
_NODE = {
    "type": "object",
    "required": ["host", "node_rank", "ranks", "address", "status", "versions", "checks", "plan"],
    "additionalProperties": False,
    "properties": {
        "host": {"type": "string"},
        "node_rank": {"type": ["integer", "null"]},
        "ranks": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "address": {"type": ["string", "null"]},
        "status": _STATUS,
        "versions": {
            "type": "object",
            "required": ["python", "torch", "cuda", "nccl", "shoal"],
            "additionalProperties": {"type": "string"},
        },
        "checks": {"type": "array", "items": _CHECK, "minItems": 1},
        "plan": _PLAN,
    },
}
_LINK = {
    "type": "object",
    "required": ["a", "b", "hosts"],
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "integer"},
        "hosts": {"type": "array", "items": {"type": ["string", "null"]}, "minItems": 2, "maxItems": 2},
        "rtt_s": {"type": "number", "exclusiveMinimum": 0},
        "a_to_b": {"type": "number", "exclusiveMinimum": 0},
        "b_to_a": {"type": "number", "exclusiveMinimum": 0},
        "bytes_per_s": {"type": "number", "exclusiveMinimum": 0},
        "status": _STATUS,
        "error": {"type": "string"},
    },
    "oneOf": [{"required": ["error"]}, {"required": ["rtt_s", "a_to_b", "b_to_a", "bytes_per_s"]}],
}
_CLUSTER = {
    "type": "object",
    "required": ["world_size", "nodes", "scheme", "master", "elapsed_s", "checks", "links"],
    "properties": {
        "world_size": {"type": "integer", "minimum": 2},
        "nodes": {"type": "integer", "minimum": 1},
        "scheme": {"type": "string"},
        "master": {"type": "string"},
        "elapsed_s": {"type": "number", "minimum": 0},
        "checks": {"type": "array", "items": _CHECK},
        "links": {"type": "array", "items": _LINK},
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "shoal doctor --json",
    "type": "object",
    "required": ["schema", "mode", "status", "counts", "nodes", "cluster"],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "mode": {"enum": ["node", "cluster"]},
        "status": _STATUS,
        "counts": {
            "type": "object",
            "required": ["ok", "warn", "fail"],
            "additionalProperties": False,
            "properties": {s: {"type": "integer", "minimum": 0} for s in ("ok", "warn", "fail")},
        },
        "nodes": {"type": "array", "items": _NODE, "minItems": 1},
        "cluster": {"oneOf": [{"type": "null"}, _CLUSTER]},
    },
    "if": {"properties": {"mode": {"const": "node"}}},
    "then": {"properties": {"cluster": {"type": "null"}, "nodes": {"maxItems": 1}}},
    "else": {"properties": {"cluster": {"type": "object"}}},
}
