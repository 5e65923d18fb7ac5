"""A harness that renders the *official* Kimi chat templates the way transformers does.

Test helper, written here from the behaviour of `transformers.apply_chat_template` (5.x) and of
the Kimi tokenizer's own code as described in ../shared/reference/kimi-k2-format.md and
../shared/models/README.md. It never imports specgen's renderers or encoder, so the tests that
compare specgen with it are differential:

* messages: keys whose value is None are dropped, and reasoning under `reasoning_content`,
  `thinking` or `reasoning` is handed to the template as `reasoning_content` (and `thinking`);
* jinja2: ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, a `tojson`
  that is plain `json.dumps` (non-ASCII kept, no HTML escaping), `raise_exception`;
* K2.5: tools are deep-sorted by key, written by the official `tool_declaration_ts.py` (loaded
  by path) and passed as `tools_ts_str`; when that raises, the template writes JSON itself;
* encoding (the walk of tests/test_tokenizer_long_runs.py): 400,000-character windows and, inside each, a cut at every run of
  more than 25,000 whitespace or non-whitespace characters; each piece is BPE-encoded with all
  special tokens allowed.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def transformers_messages(messages: Sequence[dict]) -> list[dict]:
    """What apply_chat_template hands the template: None-valued keys dropped, reasoning aliased."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        r = next((m[k] for k in REASONING_KEYS if m.get(k) is not None), None)
        if r is not None:
            m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


def deep_sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: deep_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sorted(v) for v in value]
    return value


def compile_official(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OfficialKimi:
    """The official template + tool encoder + the Kimi encoding rule, over tiktoken."""

    def __init__(self, template: Path, tiktoken_model: Path, config: Path,
                 tool_declaration: Path | None = None, sort_tools: bool = True):
        import base64

        import tiktoken

        self.template = compile_official(template.read_text(encoding="utf-8"))
        self.ts = load_module(tool_declaration, "official_tool_declaration_ts") \
            if tool_declaration else None
        self.sort_tools = sort_tools
        ranks = {}
        for line in tiktoken_model.read_text().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        added = json.loads(config.read_text(encoding="utf-8"))["added_tokens_decoder"]
        special = {entry["content"]: int(k) for k, entry in added.items()}
        for i in range(len(ranks), len(ranks) + 256):  # unnamed reserved slots
            special.setdefault(f"<|reserved_token_{i}|>", i)
        self.enc = tiktoken.Encoding(name="official-kimi", pat_str=PAT_STR,
                                     mergeable_ranks=ranks, special_tokens=special)

    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None = None, *,
               add_generation_prompt: bool, **kwargs) -> str:
        variables = dict(kwargs)
        if tools and self.sort_tools:
            tools = deep_sorted(list(tools))
        if tools and self.ts is not None:
            try:
                variables["tools_ts_str"] = self.ts.encode_tools_to_typescript_style(tools)
            except Exception:  # the official code prints the error and falls back to JSON
                pass
        return self.template.render(messages=transformers_messages(messages),
                                    tools=list(tools) if tools else None,
                                    add_generation_prompt=add_generation_prompt, **variables)

    def encode(self, text: str) -> list[int]:
        from test_tokenizer_long_runs import walk  # the rule, walked literally

        return [i for piece in walk(text) for i in self.enc.encode(piece, allowed_special="all")]

    def encode_sampled(self, text: str) -> list[int]:
        """Ids of a completion as a model samples it: special tokens are single ids, and the
        rule runs on each text between them (no text before the completion counts)."""
        import re

        names = sorted(self.enc._special_tokens, key=len, reverse=True)
        out, pos = [], 0
        for m in re.finditer("|".join(map(re.escape, names)), text):
            if m.start() > pos:
                out += self.encode(text[pos:m.start()])
            out.append(self.enc._special_tokens[m.group()])
            pos = m.end()
        if pos < len(text):
            out += self.encode(text[pos:])
        return out

    def sample_ids(self, messages, tools=None, **kwargs) -> list[int]:
        """One forward pass: the prompt of messages[:-1] encoded (the tokenizer's own encode),
        then the template's text of the final message encoded as sampled."""
        prompt = self.render(messages[:-1], tools, add_generation_prompt=True, **kwargs)
        full = self.render(messages, tools, add_generation_prompt=False, **kwargs)
        if not full.startswith(prompt):
            raise AssertionError("the generation prompt is not a prefix of the full render")
        return self.encode(prompt) + self.encode_sampled(full[len(prompt):])

    def ids(self, messages, tools=None, *, add_generation_prompt: bool, **kwargs) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=add_generation_prompt,
                                       **kwargs))


# The Kimi pre-tokenizer pattern, as given in ../shared/reference/kimi-k2-format.md.
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
