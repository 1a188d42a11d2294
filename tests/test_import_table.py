"""The flag table of `vime import`: every row names a real flag and a real key, and
docs/import.md is generated from it."""

from __future__ import annotations

import json

from specsupport import ROOT

from vime.flags import catalog
from vime.importer import table
from vime.importer.docs import markdown
from vime.importer.mapping import upstream_options

SCHEMA = json.loads((ROOT / "schema" / "vime.schema.json").read_text())


def _schema_has(dotted: str) -> bool:
    node = SCHEMA
    for part in dotted.split("."):
        node = node.get("items", node)  # an array of tables: its tables' keys
        node = node.get("properties", {}).get(part)
        if node is None:
            return False
    return True


def test_docs_import_md_is_current():
    assert (ROOT / "docs" / "import.md").read_text() == markdown(), "run `make docs`"


def test_every_row_names_a_flag_some_parser_has():
    megatron, vllm = catalog("megatron"), catalog("vllm")
    upstream = {option for options in upstream_options().values() for option in options}
    for row in table.FLAGS:
        for name in row.names:
            if name.startswith("--no-") and "--" + name[len("--no-"):] in upstream:
                continue  # argparse.BooleanOptionalAction's negative spelling
            if row.source == "sglang":
                assert name.startswith("--sglang-"), name
            elif row.source == "slime-mis":
                assert name in table.MIS_EXAMPLE_OPTIONS, name
            elif name.startswith("--vllm-") and name not in upstream:
                assert vllm.newest("--" + name[len("--vllm-"):]) is not None, name
            else:
                assert name in upstream or megatron.newest(name) is not None, \
                    f"{name}: no parser has it"


def test_every_key_row_names_a_schema_key():
    for row in table.FLAGS:
        if row.kind in ("key", "cluster", "joint") and row.value != "json":
            assert _schema_has(row.key), row.key
        if row.kind == "arch":
            assert _schema_has(f"model.arch.{row.key}"), row.key
    for key in table.UPSTREAM_DEFAULTS:
        assert _schema_has(key), key


def test_a_flag_has_one_row():
    names = [name for row in table.FLAGS for name in row.names]
    assert len(names) == len(set(names))


def test_every_code_explains_itself_with_a_fix():
    for code in table.CODES:
        text = table.explain(code)
        assert text.startswith(code) and ("Fix" in text or "fix" in text), code
    assert table.explain("V999") is None
