"""Kimi K2.5 tool declaration: OpenAI tools written as a TypeScript-style namespace.

Written from ../shared/reference/kimi-k2-format.md (see docs/renderers.md). The tools are
deep-sorted by key first, then::

    # Tools\\n\\n## functions\\nnamespace functions {\\n<function blocks joined by \\n>\\n}\\n

A function block is its `$defs` interfaces, its description as `// ` comment lines, then
`type NAME = (_: PARAMS) => any;`. Schemas the encoder cannot express raise
`ToolSchemaError`; `kimi_k25_tool_declaration` then falls back to compact JSON, as the model's
own tokenizer does.

Switches for the choices the reference marks [unsure] (tests name the choice made):

* `DEFAULT_STYLE`: how `// Default: X` writes an int/float/bool default. ``"python"``
  (``repr``: ``True``, ``1.5``) or ``"json"`` (``true``). Strings, lists and objects are
  always ``json.dumps(..., ensure_ascii=False)``.
* `FALLBACK_TO_JSON`: write compact JSON when the TypeScript encoder fails (or finds no
  function tool), instead of raising.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

from .. import jsonexact
from ..conversation import Tool

DEFAULT_STYLE: Literal["python", "json"] = "python"
FALLBACK_TO_JSON: bool = True

INDENT = "  "
FIELD_SEP = ",\n"

# Constraint keys printed in the `// k: v` line, by schema type.
_CONSTRAINT_KEYS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("maxItems", "minItems"),
}
# Member types of a `"type": [...]` list.
_UNION_MEMBER = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}


class ToolSchemaError(ValueError):
    """A tool's JSON schema has a shape the TypeScript encoder cannot write."""


def deep_sort(obj: Any) -> Any:
    """Sort every mapping by key, recursively (the Kimi tokenizers sort tools this way)."""
    if isinstance(obj, dict):
        return {k: deep_sort(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [deep_sort(v) for v in obj]
    return obj


def tools_json(tools: Sequence[Tool], separators: tuple[str, str] = (",", ":")) -> str:
    """Deep-sorted tools as JSON, exactly as HF's `tojson` filter writes them."""
    return json.dumps(deep_sort(list(tools)), ensure_ascii=False, separators=separators)


def kimi_k25_tool_declaration(tools: Sequence[Tool]) -> str:
    """What K2.5 puts in its `tool_declare` message: TypeScript, else compact JSON.

    Cached on the tools' JSON: a run declares the same few tool lists again and again.
    """
    try:
        key = jsonexact.dumps(list(tools))
    except TypeError:  # not plain JSON data (e.g. an int beyond 64 bits): skip the cache
        return _declaration(list(tools), DEFAULT_STYLE, FALLBACK_TO_JSON)
    return _cached_declaration(key, DEFAULT_STYLE, FALLBACK_TO_JSON)


@lru_cache(maxsize=256)
def _cached_declaration(tools_key: bytes, style: str, fallback: bool) -> str:
    return _declaration(jsonexact.loads(tools_key), style, fallback)


def _declaration(tools: list[Any], style: str, fallback: bool) -> str:
    try:
        text = typescript_tool_declaration(tools)
    except (ValueError, TypeError):  # ToolSchemaError, or data no schema could hold
        if not fallback:
            raise
        text = ""
    if not text:
        if not fallback:
            raise ToolSchemaError("no tool of type 'function' to declare")
        return tools_json(tools)
    return text


def typescript_tool_declaration(tools: Sequence[Tool]) -> str:
    """`# Tools\\n\\n## functions\\nnamespace functions {...}\\n` for OpenAI-format tools.

    Tools are deep-sorted first; tools whose `type` is not "function" are skipped. Returns ""
    when no function tool is left. Raises ToolSchemaError for schemas it cannot express.
    """
    blocks = []
    for tool in deep_sort(list(tools)):
        if not isinstance(tool, dict):
            raise ToolSchemaError(f"a tool must be an object, not {type(tool).__name__}")
        fn = tool.get("function")
        if tool.get("type") != "function" or not fn:
            continue
        if not isinstance(fn, dict):
            raise ToolSchemaError("tool 'function' must be an object")
        blocks.append(_function_block(fn))
    if not blocks:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(blocks) + "\n}\n"


# -- schema model -----------------------------------------------------------------------------
# A schema is parsed into a small tree first (so every `$defs` entry and self-reference is known
# before anything is written), then written out with an indent.


class _Type:
    description: str = ""
    constraints: dict[str, Any]

    def __init__(self, schema: Mapping[str, Any], constraint_keys: Sequence[str] = ()):
        desc = schema.get("description")
        if desc and not isinstance(desc, str):
            raise ToolSchemaError(f"description must be a string, not {type(desc).__name__}")
        self.description = desc or ""
        self.constraints = {k: schema[k] for k in constraint_keys if k in schema}

    def comments(self, indent: str) -> str:
        """`// description` lines then the `// k: v` constraint line, each ending in \\n."""
        out = ""
        if self.description:
            out += _comment_lines(self.description, indent) + "\n"
        if self.constraints:
            pairs = ", ".join(f"{k}: {self.constraints[k]}" for k in sorted(self.constraints))
            out += f"{indent}// {pairs}\n"
        return out

    def ts(self, indent: str) -> str:
        raise NotImplementedError


class _Scalar(_Type):
    def __init__(self, name: Any, schema: Mapping[str, Any] | None = None):
        # Any other `type` value is written as Python's str() of it, as the official encoder
        # does (`"type": null` -> `None`, an object type -> its dict repr).
        keys = _CONSTRAINT_KEYS.get(name, ()) if isinstance(name, str) else ()
        super().__init__(schema or {}, keys)
        self.name = "number" if name == "integer" else name

    def ts(self, indent: str) -> Any:
        # The official encoder returns the value itself: an f-string then writes str() of it,
        # while a join or a `+` with it raises TypeError (the JSON fallback).
        return self.name


class _Field:
    def __init__(self, name: str, type_: _Type, optional: bool, default: Any):
        self.name, self.type, self.optional, self.default = name, type_, optional, default

    def ts(self, indent: str) -> str:
        out = self.type.comments(indent)
        if self.default is not None:
            out += f"{indent}// Default: {_default_text(self.default)}\n"
        mark = "?" if self.optional else ""
        return f"{out}{indent}{self.name}{mark}: {self.type.ts(indent)}"


class _Object(_Type):
    def __init__(self, schema: Mapping[str, Any], reg: _Registry):
        super().__init__(schema)
        self.fields: list[_Field] = []
        self.extra: _Type | bool | None = None
        if not schema:
            return
        defs = schema.get("$defs")
        if defs:
            if not isinstance(defs, dict):
                raise ToolSchemaError("$defs must be an object")
            reg.defs.update(defs)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            self.extra = _parse(extra, reg)
        elif extra is None or isinstance(extra, bool):
            self.extra = extra
        else:
            raise ToolSchemaError(f"unsupported additionalProperties {extra!r}")
        if "properties" not in schema:
            return
        props = schema["properties"]
        if not isinstance(props, dict):
            raise ToolSchemaError("properties must be an object")
        # The official encoder takes `set(required)`: a string names its characters (an
        # unhashable member or a number raises TypeError: the JSON fallback).
        required = set(schema.get("required", []))
        for name, prop in props.items():
            default = prop.get("default") if isinstance(prop, dict) else None
            self.fields.append(_Field(name, _parse(prop, reg), name not in required, default))

    def ordered_fields(self) -> list[_Field]:
        """Required fields first, each group sorted by name."""
        return sorted(self.fields, key=lambda f: (f.optional, f.name))

    def ts(self, indent: str) -> str:
        inner = indent + INDENT
        parts = [f.ts(inner) for f in self.ordered_fields()]
        if self.extra is not None:
            if self.extra is True:
                extra_ts = "any"
            elif self.extra is False:
                extra_ts = "never"
            else:
                extra_ts = self.extra.ts(inner)
            parts.append(f"{inner}[k: string]: {extra_ts}")
        if not parts:
            return "{}"
        return "{\n" + FIELD_SEP.join(parts) + "\n" + indent + "}"


class _Array(_Type):
    def __init__(self, schema: Mapping[str, Any], reg: _Registry):
        super().__init__(schema, _CONSTRAINT_KEYS["array"])
        items = schema.get("items")
        self.item = _parse(items, reg) if items else _Scalar("any")

    def ts(self, indent: str) -> str:
        inner = indent + INDENT
        item_comments = self.item.comments(inner)
        if item_comments:
            item = self.item.ts(inner)
            if not isinstance(item, str):  # the official encoder concatenates with `+` here
                raise TypeError(f"array item type {item!r} is not a string")
            return f"Array<\n{item_comments}{inner}{item}\n{indent}>"
        return f"Array<{self.item.ts(indent)}>"


class _Enum(_Type):
    def __init__(self, schema: Mapping[str, Any]):
        super().__init__(schema)
        values = schema["enum"]
        if not isinstance(values, list | str | dict):
            raise ToolSchemaError("enum must be a list")
        values = list(values)  # as the official encoder iterates it: "abc" -> a, b, c
        if "type" in schema:
            _check_enum_type(values, schema["type"])
        self.values = values

    def ts(self, indent: str) -> str:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.values)


class _AnyOf(_Type):
    def __init__(self, schema: Mapping[str, Any], reg: _Registry):
        super().__init__(schema)
        members = schema["anyOf"]
        if not isinstance(members, list):
            raise ToolSchemaError("anyOf must be a list")
        self.members = [_parse(m, reg) for m in members]

    def ts(self, indent: str) -> str:
        return " | ".join(m.ts(indent) for m in self.members)


class _Union(_Type):
    def __init__(self, schema: Mapping[str, Any]):
        super().__init__(schema)
        try:
            self.members = [_UNION_MEMBER[t] for t in schema["type"]]
        except (KeyError, TypeError):
            raise ToolSchemaError(f"unsupported type list {schema['type']!r}") from None

    def ts(self, indent: str) -> str:
        return " | ".join(self.members)


class _Ref(_Type):
    def __init__(self, schema: Mapping[str, Any], reg: _Registry):
        super().__init__(schema)
        ref = schema["$ref"]
        if ref == "#":
            reg.self_ref = True
            self.name = "parameters"
        elif isinstance(ref, str) and ref.startswith("#/$defs/"):
            self.name = ref.split("/")[-1]
            if self.name not in reg.defs:
                raise ToolSchemaError(f"reference not found: {ref}")
        else:
            raise ToolSchemaError(f"unsupported reference {ref!r}")

    def ts(self, indent: str) -> str:
        return self.name


class _Registry:
    """`$defs` seen so far (in the order met) and whether the root refers to itself."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}
        self.self_ref = False


def _parse(schema: Any, reg: _Registry) -> _Type:
    if isinstance(schema, bool):
        # `true` accepts anything; `false` accepts nothing, written as null.
        return _Scalar("any" if schema else "null")
    if not isinstance(schema, dict):
        raise ToolSchemaError(f"a schema must be an object or a boolean, not {schema!r}")
    if "$ref" in schema:
        return _Ref(schema, reg)
    if "anyOf" in schema:
        return _AnyOf(schema, reg)
    if "enum" in schema:
        return _Enum(schema)
    if "type" in schema:
        typ = schema["type"]
        if isinstance(typ, list):
            return _Union(schema)
        if typ == "object":
            return _Object(schema, reg)
        if typ == "array":
            return _Array(schema, reg)
        return _Scalar(typ, schema)
    if not schema:
        return _Scalar("any")
    raise ToolSchemaError(f"schema has none of $ref/anyOf/enum/type: {schema!r}")


def _check_enum_type(values: list[Any], typ: Any) -> None:
    """Enum values must fit a declared scalar type (a `[T, "null"]` pair counts as T)."""
    if isinstance(typ, list):
        if len(typ) == 1:
            typ = typ[0]
        elif len(typ) == 2 and "null" in typ:
            typ = typ[0] if typ[0] != "null" else typ[1]
        else:
            raise ToolSchemaError(f"enum with type {typ!r} is not supported")
    fits = {
        "string": lambda v: isinstance(v, str),
        "number": lambda v: isinstance(v, int | float),
        "integer": lambda v: isinstance(v, int),
        "boolean": lambda v: isinstance(v, bool),
    }.get(typ) if isinstance(typ, str) else None
    if fits is None:
        return
    for v in values:
        if v is not None and not fits(v):
            raise ToolSchemaError(f"enum value {v!r} is not of type {typ}")


def _comment_lines(text: str, indent: str) -> str:
    """Each line as `{indent}// line`; an empty line stays empty (no indent, no //)."""
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _default_text(value: Any) -> str:
    if isinstance(value, int | float) and DEFAULT_STYLE == "python":
        return repr(value)  # bool is an int: True / False
    return json.dumps(value, ensure_ascii=False)


def _function_block(fn: Mapping[str, Any]) -> str:
    reg = _Registry()
    params = fn.get("parameters") or {}
    if not isinstance(params, dict):
        raise ToolSchemaError("function parameters must be an object")
    root = _Object(params, reg)
    name = fn.get("name", "function")

    interfaces = []
    self_ref = reg.self_ref  # decided by the root's own fields, before the $defs are written
    if self_ref:
        # The root refers to itself: it becomes `interface parameters`, fields in schema order.
        body = FIELD_SEP.join(f.ts(INDENT) for f in root.fields)
        body = f"\n{body}\n" if body else ""
        interfaces.append(f"interface parameters {{{body}}}")
    for def_name, def_schema in list(reg.defs.items()):
        if not isinstance(def_schema, dict):
            raise ToolSchemaError(f"$defs entry {def_name!r} must be an object")
        desc = def_schema.get("description")
        if desc and not isinstance(desc, str):
            raise ToolSchemaError(f"description of $defs entry {def_name!r} must be a string")
        head = _comment_lines(desc, "") + "\n" if desc else ""
        interfaces.append(f"{head}interface {def_name} {_parse(def_schema, reg).ts('')}")
    params_ts = "parameters" if self_ref else root.ts("")
    type_def = f"type {name} = (_: {params_ts}) => any;"

    desc = fn.get("description")
    if desc and not isinstance(desc, str):
        raise ToolSchemaError("function description must be a string")
    parts = ["\n".join(interfaces), _comment_lines(desc, "") if desc else "", type_def]
    return "\n".join(p for p in parts if p)
