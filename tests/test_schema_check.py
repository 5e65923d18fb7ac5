"""Tool-call arguments against the declared JSON schema (quality/schema.py)."""

from __future__ import annotations

import pytest

from specgen.client.types import ChatResponse, RawToolCall
from specgen.normalize import Quarantined, normalize
from specgen.quality.schema import schema_problem
from specgen.render import get_renderer

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1},
    "stops": {"type": "array", "items": {"type": "object", "properties": {
        "at": {"type": "string"}}, "required": ["at"]}}},
    "required": ["city"], "additionalProperties": False}


@pytest.mark.parametrize(("args", "problem"), [
    ({"city": "Paris"}, None),
    ({"city": "Paris", "unit": "c", "days": 3, "stops": [{"at": "x"}]}, None),
    ({}, "$: 'city' is a required property"),
    ({"city": "Paris", "unit": "kelvin"}, "$.unit: 'kelvin' is not one of ['c', 'f']"),
    ({"city": 3}, "$.city: 3 is not of type 'string'"),
    ({"city": "P", "days": 0}, "$.days: 0 is less than the minimum of 1"),
    ({"city": "P", "stops": [{"at": "x"}, {}]}, "$.stops[1]: 'at' is a required property"),
    ({"city": "P", "extra": 1}, "$: Additional properties are not allowed ('extra' was unexpected)"),
])
def test_failing_path_and_reason(args, problem):
    assert schema_problem(args, WEATHER) == problem


def test_schemas_that_cannot_judge_judge_nothing():
    assert schema_problem({"a": 1}, None) is None
    assert schema_problem({"a": 1}, {}) is None
    assert schema_problem({"a": 1}, {"type": "objekt"}) is None  # an invalid schema
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"a": {"type": "integer"}}}
    assert schema_problem({"a": "x"}, draft7) == "$.a: 'x' is not of type 'integer'"


def test_an_answer_breaking_its_schema_is_quarantined_with_the_path(demo_tokenizer):
    r = get_renderer("kimi-k2.5", demo_tokenizer)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]

    def answer(arguments: str) -> ChatResponse:
        return ChatResponse(
            content="", reasoning="r", reasoning_field="reasoning", tool_calls=[RawToolCall(
                index=0, id="functions.get_weather:0", name="get_weather", arguments=arguments)],
            finish_reason="tool_calls", native_finish_reason="tool_calls", provider="p",
            model="m", id="gen")

    assert normalize(answer('{"city": "Paris"}'), tools=tools, renderer=r).message.tool_calls
    with pytest.raises(Quarantined) as q:
        normalize(answer('{"city": "Paris", "unit": "K"}'), tools=tools, renderer=r)
    assert q.value.reason == "schema_mismatch"
    assert "get_weather: $.unit: 'K' is not one of ['c', 'f']" in str(q.value)
