"""The schema is the single source of keys: the resolver's dataclasses must match it."""

import dataclasses
import typing

import jsonschema

from vime import schema
from vime.resolve.spec import SECTIONS, spec_key


def _dataclass_paths(cls, prefix=()):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _dataclass_paths(hints[f.name], (*prefix, f.name))
        else:
            yield (*prefix, spec_key(f))


def test_schema_is_a_valid_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(schema.load())


def test_resolver_and_schema_declare_the_same_keys():
    from_dataclasses = {p for name, cls in SECTIONS.items() for p in _dataclass_paths(cls, (name,))}
    # open tables ([model.arch], [cluster.env]) are one dict-valued field in the dataclasses
    open_tables = {("model", "arch"), ("cluster", "env")}
    from_schema = {p[:2] if p[:2] in open_tables else p for p, _ in schema.leaves()}
    assert from_dataclasses == from_schema


def test_every_key_is_described_and_every_default_is_valid():
    for path, sub in schema.leaves():
        assert sub.get("description"), path
        if "default" in sub:
            errors = list(jsonschema.Draft202012Validator(sub).iter_errors(sub["default"]))
            assert not errors, (path, errors)


def test_every_table_is_closed():
    def walk(node, path=()):
        if node.get("type") == "object":
            if path not in (("cluster", "env"),):
                assert node.get("additionalProperties") is False, path
            for name, sub in node.get("properties", {}).items():
                walk(sub, (*path, name))
    walk(schema.load())
