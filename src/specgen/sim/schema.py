"""Tool-call arguments that are valid for a declared JSON schema (the common subset).

Understands type (also lists of types), enum, const, properties/required, items, minItems /
maxItems, minLength / maxLength, minimum / maximum (exclusive forms too), anyOf / oneOf /
allOf (first member), $ref into $defs / definitions, additionalProperties, default. Anything
it does not understand gets a plain string, which the schema may then reject: a real model
makes mistakes too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 6


class ArgumentGenerator:
    """`value(schema, rng)` -> a JSON value for the schema; `words(rng, n)` makes strings."""

    def __init__(self, words: Callable[[random.Random, int], str], *, optional_rate: float = 0.5):
        self._words = words
        self.optional_rate = optional_rate

    def arguments(self, parameters: Any, rng: random.Random) -> dict[str, Any]:
        """Arguments object for a function's `parameters` schema."""
        if not isinstance(parameters, dict):
            return {}
        value = self._value(parameters, rng, parameters, 0)
        return value if isinstance(value, dict) else {}

    def _value(self, s: Any, rng: random.Random, root: dict, depth: int) -> Any:
        if not isinstance(s, dict) or depth > MAX_DEPTH:
            return self._words(rng, 2)
        if "$ref" in s:
            target = _resolve_ref(root, s["$ref"])
            return self._value(target, rng, root, depth + 1) if target is not None else None
        if "const" in s:
            return s["const"]
        if isinstance(s.get("enum"), list) and s["enum"]:
            return rng.choice(s["enum"])
        for key in ("anyOf", "oneOf"):
            options = s.get(key)
            if isinstance(options, list) and options:
                non_null = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
                return self._value(rng.choice(non_null or options), rng, root, depth + 1)
        if isinstance(s.get("allOf"), list) and s["allOf"]:
            merged: dict[str, Any] = {}
            for part in s["allOf"]:
                if isinstance(part, dict):
                    merged.update(part)
            return self._value(merged, rng, root, depth + 1)
        typ = s.get("type")
        if isinstance(typ, list):
            non_null = [t for t in typ if t != "null"]
            typ = rng.choice(non_null) if non_null else "null"
        if typ is None:
            typ = "object" if "properties" in s else "array" if "items" in s else "string"
        if typ == "object":
            return self._object(s, rng, root, depth)
        if typ == "array":
            lo = _int(s.get("minItems"), 0)
            hi = max(lo, min(_int(s.get("maxItems"), lo + 3), lo + 3))
            n = rng.randint(max(lo, min(1, hi)), hi)
            return [self._value(s.get("items", {}), rng, root, depth + 1) for _ in range(n)]
        if typ == "string":
            return self._string(s, rng)
        if typ in ("integer", "number"):
            return self._number(s, rng, typ == "integer")
        if typ == "boolean":
            return rng.random() < 0.5
        if typ == "null":
            return None
        return self._words(rng, 2)

    def _object(self, s: dict, rng: random.Random, root: dict, depth: int) -> dict[str, Any]:
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        required = [r for r in s.get("required") or () if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or rng.random() < self.optional_rate:
                out[name] = self._value(sub, rng, root, depth + 1)
        for name in required:  # required but not described
            if name not in out:
                out[name] = self._words(rng, 1)
        extra = s.get("additionalProperties")
        if not props and isinstance(extra, dict):
            for _ in range(rng.randint(1, 2)):
                out[self._words(rng, 1).replace(" ", "_")] = self._value(extra, rng, root, depth + 1)
        return out

    def _string(self, s: dict, rng: random.Random) -> str:
        lo = _int(s.get("minLength"), 0)
        hi = _int(s.get("maxLength"), 0)
        fmt = s.get("format")
        if fmt == "date":
            text = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        elif fmt == "date-time":
            text = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"
        elif fmt in ("uri", "url"):
            text = f"https://example.com/{self._words(rng, 1)}"
        elif fmt == "email":
            text = f"{self._words(rng, 1)}@example.com"
        else:
            text = self._words(rng, rng.randint(1, 4))
        while len(text) < lo:
            text += " " + self._words(rng, 2)
        if hi and len(text) > hi:
            text = text[:hi].rstrip() or text[:hi]
        return text

    def _number(self, s: dict, rng: random.Random, integer: bool) -> int | float:
        lo = s.get("minimum", s.get("exclusiveMinimum"))
        hi = s.get("maximum", s.get("exclusiveMaximum"))
        lo = float(lo) if isinstance(lo, int | float) and not isinstance(lo, bool) else 0.0
        hi = float(hi) if isinstance(hi, int | float) and not isinstance(hi, bool) else lo + 100
        if "exclusiveMinimum" in s and "minimum" not in s:
            lo += 1 if integer else 1e-3
        if "exclusiveMaximum" in s and "maximum" not in s:
            hi -= 1 if integer else 1e-3
        if hi < lo:
            hi = lo
        if integer:
            a, b = math.ceil(lo), math.floor(hi)
            return rng.randint(a, b) if a <= b else int(a)
        return max(lo, min(hi, round(rng.uniform(lo, hi), 2)))


# Kinds of schema violation a model makes, in the order they are tried when several apply.
VIOLATIONS = ("missing_required", "wrong_type", "bad_enum")
_WRONG = {"string": 7, "integer": "seven", "number": "seven", "boolean": "yes",
          "array": "one item", "object": "an object", "null": "none"}


def violate(parameters: Any, args: dict[str, Any], rng: random.Random
            ) -> tuple[dict[str, Any], str] | None:
    """`args` changed so that they break the function's `parameters` schema at the top level:
    a required property left out, a property of the wrong type, or an enum property with a
    value outside its enum; (the arguments, the kind) or None when the schema allows
    anything (no required, typed or enum property)."""
    if not isinstance(parameters, dict):
        return None
    props = parameters.get("properties") if isinstance(parameters.get("properties"), dict) \
        else {}
    required = [r for r in parameters.get("required") or () if isinstance(r, str)]
    options: list[tuple[str, str]] = []
    for name in required:
        options.append(("missing_required", name))
    for name, sub in props.items():
        if isinstance(sub, dict) and "$ref" in sub:
            sub = _resolve_ref(parameters, sub["$ref"])
        if not isinstance(sub, dict):
            continue
        if isinstance(sub.get("enum"), list) and sub["enum"]:
            options.append(("bad_enum", name))
        elif isinstance(sub.get("type"), str) and sub["type"] in _WRONG:
            options.append(("wrong_type", name))
    if not options:
        return None
    kind, name = rng.choice(options)
    out = dict(args)
    if kind == "missing_required":
        out.pop(name, None)
    elif kind == "bad_enum":
        enum = props[name].get("enum") if isinstance(props[name], dict) else None
        out[name] = "not-" + "-".join(str(v) for v in (enum or ["any"]))[:40]
    else:
        sub = props[name]
        if "$ref" in sub:
            sub = _resolve_ref(parameters, sub["$ref"])
        out[name] = _WRONG[sub["type"]]
    return out, kind


def _resolve_ref(root: dict, ref: Any) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
