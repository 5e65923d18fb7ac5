"""Tool-call arguments checked against the JSON schema the request declared for that tool.

`schema_problem(arguments, parameters)` is the one entry point: None when the arguments fit
(or the schema cannot judge them), else a short text naming the failing path, e.g.
`$.unit: 'kelvin' is not one of ['c', 'f']`. Validators are built once per schema (a run
declares the same few tool lists again and again) with the draft the schema names
(`$schema`), else Draft 2020-12. A schema that is itself invalid judges nothing: a dataset's
sloppy schema must not count against a provider.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .. import jsonexact


def schema_problem(arguments: Any, parameters: Any) -> str | None:
    """Why `arguments` (parsed JSON) do not fit the tool's `parameters` schema, or None."""
    if not isinstance(parameters, dict) or not parameters:
        return None
    validator = _recent.get(id(parameters))
    if validator is None or validator[0] is not parameters:
        try:
            key = jsonexact.dumps(parameters, sort_keys=True)
        except TypeError:
            return None  # not plain JSON data: nothing to judge with
        if len(_recent) > 1024:
            _recent.clear()
        validator = _recent[id(parameters)] = (parameters, _validator(key))
    validator = validator[1]
    if validator is None or validator.is_valid(arguments):
        return None
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    return f"{_path(error.absolute_path)}: {_short(error.message)}"


# The validator of the schema objects seen last, by identity (the same tools object serves a
# whole conversation, often a whole dataset): no re-serialising to find it. The entry keeps
# the object alive, so an id is never reused while it is here.
_recent: dict[int, tuple[Any, Any]] = {}


@lru_cache(maxsize=256)
def _validator(key: bytes):
    import jsonschema

    schema = jsonexact.loads(key)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        return None
    return cls(schema)


def _path(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _short(message: str, limit: int = 160) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"
