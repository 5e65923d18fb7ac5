"""K2.5 TypeScript tool declaration (render/kimi_tools.py), rule by rule.

Expected strings are written out by hand from ../shared/reference/kimi-k2-format.md.
Choices for the items the reference marks [unsure]:
  * `// Default:` writes int/float/bool with Python repr (`True`), switch DEFAULT_STYLE.
  * a schema the encoder cannot write falls back to compact JSON, switch FALLBACK_TO_JSON.
"""

from __future__ import annotations

import json

import pytest

from specgen.render import kimi_tools
from specgen.render.kimi_tools import (
    ToolSchemaError,
    kimi_k25_tool_declaration,
    typescript_tool_declaration,
)

HEAD = "# Tools\n\n## functions\nnamespace functions {\n"
TAIL = "\n}\n"


def fn(name="f", params=None, description=None):
    f = {"name": name}
    if description is not None:
        f["description"] = description
    if params is not None:
        f["parameters"] = params
    return {"type": "function", "function": f}


def obj(props, required=(), **extra):
    return {"type": "object", "properties": props, "required": list(required), **extra}


def ts(*tools):
    out = typescript_tool_declaration(list(tools))
    assert out.startswith(HEAD) and out.endswith(TAIL)
    return out[len(HEAD):-len(TAIL)]


def test_frame_and_empty_parameters():
    assert typescript_tool_declaration([fn("ping")]) == (
        "# Tools\n\n## functions\nnamespace functions {\ntype ping = (_: {}) => any;\n}\n"
    )
    assert ts(fn("ping", obj({}))) == "type ping = (_: {}) => any;"
    assert ts(fn("ping", {"type": "object"})) == "type ping = (_: {}) => any;"


def test_function_description_comments_keep_empty_lines_empty():
    out = ts(fn("f", obj({}), description="First line.\n\nThird line."))
    assert out == "// First line.\n\n// Third line.\ntype f = (_: {}) => any;"


def test_several_functions_joined_by_newline_in_sorted_key_order():
    # deep sort orders keys, not the list: functions keep their list order
    out = ts(fn("b", description="B"), fn("a"))
    assert out == "// B\ntype b = (_: {}) => any;\ntype a = (_: {}) => any;"


def test_required_first_then_optional_each_sorted_by_name():
    params = obj(
        {"zeta": {"type": "string"}, "alpha": {"type": "string"},
         "mid": {"type": "number"}, "beta": {"type": "boolean"}},
        required=["zeta", "mid"],
    )
    assert ts(fn("f", params)) == (
        "type f = (_: {\n"
        "  mid: number,\n"
        "  zeta: string,\n"
        "  alpha?: string,\n"
        "  beta?: boolean\n"
        "}) => any;"
    )


def test_field_comments_constraints_and_defaults():
    params = obj(
        {
            "city": {"type": "string", "description": "City name.\nNo abbreviations.",
                     "minLength": 1, "maxLength": 50, "pattern": "^[A-Z]"},
            "days": {"type": "integer", "minimum": 1, "maximum": 16, "default": 3},
            "ratio": {"type": "number", "default": 0.5},
            "metric": {"type": "boolean", "default": True, "minimum": 3},  # no constraints on bool
            "label": {"type": "string", "default": "héllo"},
            "opts": {"type": "object", "default": {"a": 1}, "description": "Options"},
            "nothing": {"type": "string", "default": None},
        },
        required=["city"],
    )
    assert ts(fn("f", params)) == (
        "type f = (_: {\n"
        "  // City name.\n"
        "  // No abbreviations.\n"
        "  // maxLength: 50, minLength: 1, pattern: ^[A-Z]\n"
        "  city: string,\n"
        "  // maximum: 16, minimum: 1\n"
        "  // Default: 3\n"
        "  days?: number,\n"
        '  // Default: "héllo"\n'
        "  label?: string,\n"
        "  // Default: True\n"
        "  metric?: boolean,\n"
        "  nothing?: string,\n"
        "  // Options\n"
        '  // Default: {"a": 1}\n'
        "  opts?: {},\n"
        "  // Default: 0.5\n"
        "  ratio?: number\n"
        "}) => any;"
    )


def test_default_style_switch(monkeypatch):
    params = obj({"on": {"type": "boolean", "default": False}, "n": {"type": "integer", "default": 2}})
    assert "// Default: False\n" in ts(fn("f", params))  # the choice made: Python repr
    monkeypatch.setattr(kimi_tools, "DEFAULT_STYLE", "json")
    out = ts(fn("f", params))
    assert "// Default: false\n" in out and "// Default: 2\n" in out


def test_enum_any_of_and_type_lists():
    params = obj(
        {
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
            "mixed": {"enum": ["a", 1, 2.5, True, None]},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}],
                       "description": "Either"},
            "many": {"type": ["string", "integer", "object", "array", "boolean", "null"]},
            "opt_enum": {"type": ["string", "null"], "enum": ["x", None]},
        },
        required=["unit"],
    )
    assert ts(fn("f", params)) == (
        "type f = (_: {\n"
        "  // Unit\n"
        '  unit: "celsius" | "fahrenheit",\n'
        "  // Either\n"
        "  either?: string | number | null,\n"
        "  many?: string | number | {} | Array<any> | boolean | null,\n"
        '  mixed?: "a" | 1 | 2.5 | True | None,\n'
        '  opt_enum?: "x" | None\n'
        "}) => any;"
    )


def test_arrays_plain_commented_items_constraints_and_nesting():
    params = obj(
        {
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
            "anything": {"type": "array"},
            "notes": {"type": "array", "items": {"type": "string", "description": "One note",
                                                 "maxLength": 9}},
            "points": {"type": "array", "items": obj({"x": {"type": "number"}}, ["x"])},
            "rows": {"type": "array", "items": {"type": "object", "description": "A row",
                                                "properties": {"id": {"type": "integer"}}}},
            "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        },
        required=["tags"],
    )
    assert ts(fn("f", params)) == (
        "type f = (_: {\n"
        "  // maxItems: 5, minItems: 1\n"
        "  tags: Array<string>,\n"
        "  anything?: Array<any>,\n"
        "  grid?: Array<Array<number>>,\n"
        "  notes?: Array<\n"
        "    // One note\n"
        "    // maxLength: 9\n"
        "    string\n"
        "  >,\n"
        "  points?: Array<{\n"
        "    x: number\n"
        "  }>,\n"
        "  rows?: Array<\n"
        "    // A row\n"
        "    {\n"
        "      id?: number\n"
        "    }\n"
        "  >\n"
        "}) => any;"
    )


def test_nested_objects_indent_two_spaces_per_level():
    params = obj({"a": obj({"b": obj({"c": {"type": "string", "description": "deep"}}, ["c"])},
                           ["b"])}, ["a"])
    assert ts(fn("f", params)) == (
        "type f = (_: {\n"
        "  a: {\n"
        "    b: {\n"
        "      // deep\n"
        "      c: string\n"
        "    }\n"
        "  }\n"
        "}) => any;"
    )


def test_additional_properties():
    params = obj(
        {
            "free": {"type": "object", "additionalProperties": True},
            "closed": obj({"k": {"type": "string"}}, additionalProperties=False),
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        }
    )
    assert ts(fn("f", params)) == (
        "type f = (_: {\n"
        "  closed?: {\n"
        "    k?: string,\n"
        "    [k: string]: never\n"
        "  },\n"
        "  counts?: {\n"
        "    [k: string]: number\n"
        "  },\n"
        "  free?: {\n"
        "    [k: string]: any\n"
        "  }\n"
        "}) => any;"
    )


def test_defs_and_refs_become_interfaces_before_the_description():
    params = {
        "type": "object",
        "$defs": {
            "Point": {"type": "object", "description": "A point.",
                      "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                      "required": ["x", "y"]},
            "Color": {"enum": ["red", "blue"]},
        },
        "properties": {
            "at": {"$ref": "#/$defs/Point", "description": "Where"},
            "color": {"$ref": "#/$defs/Color"},
        },
        "required": ["at"],
    }
    assert ts(fn("draw", params, description="Draw a dot.")) == (
        'interface Color "red" | "blue"\n'
        "// A point.\n"
        "interface Point {\n"
        "  x: number,\n"
        "  y: number\n"
        "}\n"
        "// Draw a dot.\n"
        "type draw = (_: {\n"
        "  // Where\n"
        "  at: Point,\n"
        "  color?: Color\n"
        "}) => any;"
    )


def test_self_reference_makes_the_root_an_interface():
    params = obj({"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
                 ["name"])
    # the root interface keeps schema order (deep-sorted), not required-first
    assert ts(fn("tree", params)) == (
        "interface parameters {\n"
        "  children?: Array<parameters>,\n"
        "  name: string\n"
        "}\n"
        "type tree = (_: parameters) => any;"
    )


def test_deep_sort_makes_key_order_irrelevant():
    a = fn("f", obj({"b": {"type": "string"}, "a": {"description": "A", "type": "string"}}))
    b = {"function": {"parameters": {"required": [], "properties": {
        "a": {"type": "string", "description": "A"}, "b": {"type": "string"}},
        "type": "object"}, "name": "f"}, "type": "function"}
    assert typescript_tool_declaration([a]) == typescript_tool_declaration([b])


def test_non_function_tools_are_skipped():
    assert typescript_tool_declaration([{"type": "_plugin", "name": "x"}]) == ""
    assert ts({"type": "_plugin"}, fn("g")) == "type g = (_: {}) => any;"


@pytest.mark.parametrize(
    "params",
    [
        obj({"x": {"type": "string", "enum": [1, 2]}}),  # enum values not of the declared type
        obj({"x": {"$ref": "#/definitions/X"}}),  # only #/$defs/ references
        obj({"x": {"$ref": "#/$defs/Missing"}}),
        obj({"x": {"type": ["string", "date"]}}),
        obj({"x": {"description": "no type at all"}}),
        obj({"x": "string"}),
    ],
)
def test_unwritable_schemas_fall_back_to_compact_sorted_json(params, monkeypatch):
    tools = [fn("f", params, description="d")]
    with pytest.raises(ToolSchemaError):
        typescript_tool_declaration(tools)
    expected = json.dumps(kimi_tools.deep_sort(tools), ensure_ascii=False, separators=(",", ":"))
    assert kimi_k25_tool_declaration(tools) == expected
    monkeypatch.setattr(kimi_tools, "FALLBACK_TO_JSON", False)
    with pytest.raises(ToolSchemaError):
        kimi_k25_tool_declaration(tools)


def test_no_function_tool_falls_back_to_json():
    tools = [{"type": "_plugin", "b": 1, "a": "é"}]
    assert kimi_k25_tool_declaration(tools) == '[{"a":"é","b":1,"type":"_plugin"}]'


def test_boolean_schemas():
    params = obj({"anything": True, "nothing": False})
    assert ts(fn("f", params)) == "type f = (_: {\n  anything?: any,\n  nothing?: null\n}) => any;"


def test_declaration_is_cached_but_follows_the_switches(monkeypatch):
    tools = [fn("f", obj({"on": {"type": "boolean", "default": True}}))]
    first = kimi_k25_tool_declaration(tools)
    assert kimi_k25_tool_declaration(tools) is first
    monkeypatch.setattr(kimi_tools, "DEFAULT_STYLE", "json")
    assert "Default: true" in kimi_k25_tool_declaration(tools)
