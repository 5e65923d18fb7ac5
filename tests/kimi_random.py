"""Seeded random conversations for the differential against the official Kimi templates.

Plain `random.Random(seed)` so the test suite runs a small seeded slice and
`bench/official_kimi_diff.py` runs thousands with the same generator. Shapes: nested tool
schemas (enums, anyOf, type lists, $defs/$ref, defaults, and the odd ones the official
TypeScript encoder still writes: `"type": null`, an object as type, a string enum, a string
`required`), tool loops with several calls, reasoning in history and in the final turn, list
content with text parts, images and bare strings (some containing "image"), names,
literal special-token text, CJK/CRLF, long runs (also at the start of a completion), object
and non-JSON arguments, developer messages.
"""

from __future__ import annotations

import json
import random
import string

SPECIAL_TEXT = ["<|im_end|>", "<think>", "</think>", "<|im_user|>", "<|tool_call_begin|>",
                "[EOS]", "<|im_middle|>"]
WORDS = ["hello", "Paris", " the", "naïve", "中文字符", "東京", "😀", "x=1", '{"a": 1}', "\r\n",
         "\n\n", "\t", "  ", "'s", "123456", "// note", "é", " image", "an image"]
LONG = ["a " + "\t" * 25003 + "x", "y" * 25001, " " * 25002 + "z", "q" * 24999 + " " + "w" * 25001,
        "\n" * 30000, "Zm9v" * 7000]
IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}


class Gen:
    def __init__(self, seed: int, *, long_runs: bool = True):
        self.r = random.Random(seed)
        self.long_runs = long_runs

    def text(self) -> str:
        r = self.r
        if r.random() < 0.5:
            return "".join(r.choice(WORDS + SPECIAL_TEXT) for _ in range(r.randint(0, 8)))
        return "".join(r.choice(string.printable + "éü中文😀") for _ in range(r.randint(0, 40)))

    def rich(self) -> str:
        if self.long_runs and self.r.random() < 0.04:
            return self.r.choice(LONG)
        return self.text()

    def name(self) -> str:
        return "".join(self.r.choice(string.ascii_lowercase + "_")
                       for _ in range(self.r.randint(1, 10)))

    def content(self, *, allow_none: bool = True, bare: bool = True):
        r = self.r.random()
        if r < 0.6:
            return self.rich()
        if r < 0.7 and allow_none:
            return None
        parts = []
        for _ in range(self.r.randint(0, 3)):
            k = self.r.random()
            if k < 0.6:
                parts.append({"type": "text", "text": self.text()})
            elif k < 0.8:
                parts.append(IMAGE)
            elif bare:
                parts.append(self.r.choice(["plain string part", "an image here", self.text()]))
            else:
                parts.append({"type": "text", "text": self.text()})
        return parts

    # -- schemas ----------------------------------------------------------------------------
    def schema(self, depth: int):
        r = self.r
        k = r.random()
        if depth <= 0 or k < 0.45:
            kind = r.random()
            if kind < 0.55:
                s = {"type": r.choice(["string", "number", "integer", "boolean", "null"])}
                if r.random() < 0.3:
                    s["description"] = self.text()
                if r.random() < 0.2:
                    s["default"] = r.choice([r.randint(-5, 5), True, self.text(), 0.5])
                if r.random() < 0.15:
                    s["maxLength"] = r.randint(0, 9)
                if r.random() < 0.15:
                    s["minimum"] = r.randint(-3, 3)
                return s
            if kind < 0.75:
                s = {"enum": [r.choice([self.name(), r.randint(0, 3)])
                              for _ in range(r.randint(1, 3))]}
                if r.random() < 0.3:
                    s["type"] = "string"
                return s
            if kind < 0.88:
                return {"type": r.sample(["string", "null", "integer", "object", "array"],
                                         r.randint(1, 3))}
            return r.choice([{"type": None}, {"type": {"kind": "x"}}, {"enum": "abc"},
                             {"type": "string", "enum": "xy"}, {"enum": 3}])
        if k < 0.6:
            s = {"type": "array", "items": self.schema(depth - 1)}
            if r.random() < 0.3:
                s["minItems"] = r.randint(0, 2)
            return s
        if k < 0.75:
            return {"anyOf": [self.schema(depth - 1) for _ in range(r.randint(1, 3))]}
        return self.object_schema(depth - 1)

    def object_schema(self, depth: int) -> dict:
        r = self.r
        props = {self.name(): self.schema(depth) for _ in range(r.randint(0, 4))}
        s = {"type": "object", "properties": props}
        roll = r.random()
        if roll < 0.08 and props:
            s["required"] = r.choice(sorted(props))  # a string: the official takes its chars
        elif props:
            s["required"] = r.sample(sorted(props), r.randint(0, len(props)))
        else:
            s["required"] = []
        if r.random() < 0.2:
            s["description"] = self.text()
        if r.random() < 0.15:
            s["additionalProperties"] = r.choice([True, False, self.schema(0)])
        return s

    def parameters(self):
        r = self.r.random()
        if r < 0.15:
            return {}
        if r < 0.3:
            a, b = self.object_schema(1), self.object_schema(1)
            return {**a, "$defs": {"Item": b},
                    "properties": {**a["properties"], "item": {"$ref": "#/$defs/Item"}}}
        return self.object_schema(2)

    def tools(self):
        if self.r.random() < 0.4:
            return None
        out = []
        for _ in range(self.r.randint(1, 3)):
            fn = {"name": self.name()}
            if self.r.random() < 0.7:
                fn["description"] = self.text()
            if self.r.random() < 0.85:
                fn["parameters"] = self.parameters()
            out.append({"type": "function", "function": fn})
        return out

    # -- conversations ----------------------------------------------------------------------
    def arguments(self):
        r = self.r.random()
        d = {self.name(): self.r.choice([self.r.randint(-9, 99), self.text(), True, None])
             for _ in range(self.r.randint(0, 3))}
        if r < 0.3:
            return d
        if r < 0.6:
            return json.dumps(d, separators=(",", ":"))
        if r < 0.85:
            return json.dumps(d)
        return self.text()

    def assistant(self, *, calls=None, long_start: bool = False) -> dict:
        content = self.r.choice(LONG[:2]) if long_start else self.content(bare=True)
        m: dict = {"role": "assistant", "content": content}
        if calls:
            m["tool_calls"] = calls
        if self.r.random() < 0.6:
            m[self.r.choice(["reasoning_content", "reasoning"])] = self.text()
        return m

    def conversation(self, *, tool_calls: bool = True, names: bool = True,
                     developer: bool = False, allow_none: bool = True) -> list[dict]:
        r = self.r
        msgs: list[dict] = []
        k = 0
        if r.random() < 0.5:
            msgs.append({"role": "system", "content": self.rich()})
        if developer and r.random() < 0.3:
            msgs.append({"role": "developer", "content": self.text()})
        for _ in range(r.randint(1, 3)):
            user = {"role": "user", "content": self.content(allow_none=allow_none)}
            if names and r.random() < 0.15:
                user["name"] = self.name()
            msgs.append(user)
            for _ in range(r.randint(0, 2) if tool_calls else 0):
                calls = []
                for _ in range(r.randint(1, 3)):
                    name = self.name()
                    calls.append({"id": r.choice([f"functions.{name}:{k}", f"call_{k}"]),
                                  "type": "function",
                                  "function": {"name": name, "arguments": self.arguments()}})
                    k += 1
                msgs.append(self.assistant(calls=calls))
                for c in calls:
                    msgs.append({"role": "tool", "tool_call_id": c["id"],
                                 "content": self.content(allow_none=allow_none)})
            if r.random() < 0.75:
                m = self.assistant(long_start=self.long_runs and r.random() < 0.03)
                if not allow_none and m["content"] is None:
                    m["content"] = ""
                msgs.append(m)
        if tool_calls and r.random() < 0.3:  # end on a tool-call turn (the sample is compared)
            name = self.name()
            calls = [{"id": f"functions.{name}:{k + j}", "type": "function",
                      "function": {"name": name, "arguments": self.arguments()}}
                     for j in range(r.randint(1, 2))]
            msgs.append(self.assistant(calls=calls,
                                       long_start=self.long_runs and r.random() < 0.1))
        return msgs
