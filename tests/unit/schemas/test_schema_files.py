"""The schema files themselves: valid, closed, bounded, and agreeing with the code."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from rankwatch.schemas import columns as cols
from rankwatch.schemas.frame import FRAME_FIELDS
from rankwatch.schemas.opbatch import HEADER_FIELDS, OpBatch
from rankwatch.schemas.optypes import COLLECTIVE_ALGORITHMS, OPTYPES
from rankwatch.schemas.registry import KINDS, SCHEMA_DIR, schema, versions
from rankwatch.schemas.topics import TOPICS


def _walk(node: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema with its path."""
    if isinstance(node, dict):
        if "type" in node or "const" in node or "enum" in node:
            yield path, node
        for key, child in node.items():
            yield from _walk(child, f"{path}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _walk(child, f"{path}[{i}]")


def test_every_topic_has_exactly_one_schema_file() -> None:
    on_disk = sorted({p.name.split(".")[0] for p in SCHEMA_DIR.glob("*.schema.json")})
    assert on_disk == sorted(TOPICS)
    # v2 adds optional fields / enum values; ops v3 is the binary frame
    grown = {"ops": (1, 2, 3), "alerts": (1, 2)}
    assert all(versions(kind) == grown.get(kind, (1,)) for kind in KINDS)
    assert all(topic == f"rankwatch.{kind}" for kind, topic in TOPICS.items())


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_valid_closed_and_names_itself(kind: str) -> None:
    raw = schema(kind)
    Draft202012Validator.check_schema(raw)
    assert raw["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert raw["additionalProperties"] is False
    assert raw["properties"]["schema"] == {"const": kind}
    assert raw["properties"]["version"] == {"const": 1}
    assert {"schema", "version"} <= set(raw["required"])


@pytest.mark.parametrize("kind", KINDS)
def test_every_value_is_bounded(kind: str) -> None:
    """No unbounded integer, string or array can reach a worker."""
    for path, node in _walk(schema(kind)):
        types = node.get("type", [])
        types = [types] if isinstance(types, str) else types
        if "integer" in types:
            assert "minimum" in node and "maximum" in node, path
            assert node["minimum"] >= -1, path
            assert node["maximum"] <= 2**64 - 1, path
        if "string" in types and "enum" not in node:
            assert "maxLength" in node or "pattern" in node, path
        if "array" in types:
            assert "maxItems" in node, path
        if "object" in types and "additionalProperties" not in node:
            assert "maxProperties" in node, path


def test_optype_enums_are_the_vocabulary() -> None:
    ops_enum = schema("ops")["properties"]["ops"]["properties"]["optype"]["items"]["enum"]
    assert tuple(ops_enum) == OPTYPES
    assert tuple(schema("heartbeats")["$defs"]["optype"]["enum"]) == OPTYPES


def test_collective_algorithms_are_the_ops_v2_enum() -> None:
    enums = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "algo" in node.get("properties", {}):
                enums.append(tuple(node["properties"]["algo"]["enum"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema("ops", 2))
    assert enums and set(enums) == {COLLECTIVE_ALGORITHMS}


def test_opbatch_fields_are_the_schema_fields() -> None:
    raw = schema("ops", versions("ops")[-1])
    scalars = [name for name, prop in raw["properties"].items() if prop.get("type") == "integer"]
    strings = [name for name, prop in raw["properties"].items() if prop.get("type") == "string"]
    assert set(HEADER_FIELDS) == {*scalars, *strings} - set(FRAME_FIELDS)
    columns = [spec.name for spec in cols.column_specs(raw)]
    assert [f.name for f in fields(OpBatch)] == [
        *HEADER_FIELDS,
        *columns,
        "steps_done",
        "rank_steps",
    ]
    assert set(raw["properties"]) == {
        "schema",
        "version",
        *HEADER_FIELDS,
        *cols.GROUPS,
        "steps_done",
        "rank_steps",
        *FRAME_FIELDS,  # how a frame lays out its columns
    }


def test_column_specs_are_read_from_the_schema() -> None:
    specs = {spec.name: spec for spec in cols.column_specs(schema("ops"))}
    assert specs["optype"].enum == OPTYPES
    assert specs["optype"].dtype == "int8"
    assert specs["duration_ns"].minimum == 0
    assert specs["mb_id"].minimum == -1
    assert specs["flops"].dtype == "float64"
    assert specs["stream"].group == "extra"
    assert cols.max_items(schema("ops")) == 100_000


def test_an_item_rule_the_codec_cannot_check_is_refused() -> None:
    raw = schema("ops")
    broken = cols.envelope_schema(raw)
    for group in cols.GROUPS:
        for name, prop in broken["properties"][group]["properties"].items():
            source = raw["properties"][group]["properties"][name]["items"]
            prop["items"] = {**source, "multipleOf": 2}
    with pytest.raises(RuntimeError, match="cannot check items"):
        cols.column_specs(broken)
