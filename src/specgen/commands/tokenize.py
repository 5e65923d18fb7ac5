"""`specgen tokenize`: offline, exact tokenization of a conversation file into training samples.

    specgen tokenize --renderer kimi-k2.5 --tokenizer DIR IN.jsonl -o OUT.jsonl
                     [--all-turns] [--skip-invalid] [--thinking | --no-thinking]
                     [--serving STACK] [--chat-template FILE] [--chat-template-kwargs JSON]

Each input line is `{"messages": [...], "tools": [...]?, "id": ...?}` (OpenAI chat format);
each output line is `{"id"?, "input_ids": [...], "loss_mask": [...]}`. The file is streamed:
memory stays flat however many lines it has. The output is written to a temporary file and
renamed into place at the end, so a failed run never leaves a half-written OUT.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tokenize",
        help="tokenize a conversation JSONL file into exact training samples",
        description=(
            "Render each conversation with the target's chat format and write its exact token "
            "ids and loss mask (0 on the prompt, 1 on what the model sampled: the last "
            "assistant message, or every assistant turn with --all-turns)."
        ),
    )
    p.add_argument("input", metavar="IN.jsonl", help="conversations, one JSON object per line ('-' = stdin)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl", help="samples ('-' = stdout)")
    p.add_argument("--renderer", default="kimi-k2.5",
                   help="chat format: kimi-k2.5 (default), kimi-k2-thinking, kimi-k2-instruct, hf")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="tokenizer directory, hub id (owner/name), or 'demo'")
    p.add_argument("--all-turns", action="store_true",
                   help="one sequence per conversation with every assistant turn masked "
                        "(only for prefix-extending formats)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="report bad lines on stderr and go on (default: stop at the first)")
    thinking = p.add_mutually_exclusive_group()
    thinking.add_argument("--thinking", dest="thinking", action="store_true", default=None,
                          help="render with thinking on (thinking/enable_thinking = true)")
    thinking.add_argument("--no-thinking", dest="thinking", action="store_false",
                          help="render with thinking off (thinking/enable_thinking = false)")
    p.add_argument("--chat-template-kwargs", metavar="JSON",
                   help="template switches as a JSON object, as a server's chat_template_kwargs "
                        "(default: none; the template's own defaults, e.g. K2.5 thinks)")
    p.add_argument("--encode", choices=("whole", "split_special"), default="whole",
                   help="how the long-run rule meets special tokens: whole (the Kimi "
                        "tokenizer's own encode) or split_special (special tokens split off "
                        "first, as vLLM, SGLang and apply_chat_template tokenize); "
                        "docs/tokenizers.md")
    p.add_argument("--serving", choices=("transformers", "vllm", "sglang"),
                   default="transformers",
                   help="how the serving stack renders history: transformers (default: "
                        "arguments verbatim) or vllm/sglang (history tool-call arguments "
                        "parsed and written back by the template's tojson)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="with --renderer hf: a jinja chat template to use instead of the tokenizer's")
    p.set_defaults(func=run)


@dataclass
class Summary:
    lines: int = 0
    samples: int = 0
    invalid: int = 0
    tokens: int = 0
    sampled_tokens: int = 0
    stray_stops: int = 0  # samples whose sampled part holds a stop id before its end


class LineError(ValueError):
    """A bad input line; the message names the line and the field."""


def run(args: argparse.Namespace) -> int:
    from ..render import RenderError, get_renderer
    from ..tokenizer import TokenizerError, load_tokenizer

    options = {}
    if args.chat_template:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                options["template"] = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"specgen tokenize: {args.chat_template}: {getattr(exc, 'strerror', None) or exc}",
                  file=sys.stderr)
            return 2
    if args.all_turns and args.serving != "transformers":
        print(f"specgen tokenize: --all-turns cannot be used with --serving {args.serving}: "
              "that stack re-renders earlier answers in later prompts, so one sequence cannot "
              "hold every turn as sampled", file=sys.stderr)
        return 2
    switches = {} if args.thinking is None else {"thinking": args.thinking,
                                                 "enable_thinking": args.thinking}
    if args.chat_template_kwargs:
        try:
            extra = json.loads(args.chat_template_kwargs)
        except ValueError as exc:
            extra = exc
        if not isinstance(extra, dict):
            print(f"specgen tokenize: --chat-template-kwargs must be a JSON object, e.g. "
                  f"'{{\"thinking\": false}}' ({extra})", file=sys.stderr)
            return 2
        switches.update(extra)
    try:
        tokenizer = load_tokenizer(args.tokenizer, getattr(args, "encode", "whole"))
        renderer = get_renderer(args.renderer, tokenizer, thinking=args.thinking is not False,
                                chat_template_kwargs=switches, **options)
    except (TokenizerError, RenderError) as exc:
        print(f"specgen tokenize: {exc}", file=sys.stderr)
        return 2
    name = "<stdin>" if args.input == "-" else args.input
    started = time.perf_counter()
    try:
        with _open_input(args.input) as src, _AtomicOutput(args.output) as out:
            summary = tokenize_lines(
                renderer, src, out.write, all_turns=args.all_turns,
                skip_invalid=args.skip_invalid, source=name, serving=args.serving,
                report=lambda msg: print(msg, file=sys.stderr),
            )
            out.commit()
    except LineError as exc:
        print(f"specgen tokenize: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"specgen tokenize: {exc.filename or name}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    took = time.perf_counter() - started
    print(
        f"specgen tokenize: {summary.lines} lines, {summary.samples} samples, "
        f"{summary.invalid} invalid{' (skipped)' if summary.invalid else ''}, "
        f"{summary.tokens} tokens ({summary.sampled_tokens} with loss), {took:.1f}s"
        + (f", {summary.stray_stops} with an end-of-turn token inside the sampled part "
           "(warned above)" if summary.stray_stops else ""),
        file=sys.stderr,
    )
    return 0


def tokenize_lines(
    renderer, lines: Iterable[bytes], write: Callable[[bytes], object], *, all_turns: bool = False,
    skip_invalid: bool = False, source: str = "<input>",
    report: Callable[[str], object] = lambda msg: None, serving: str = "transformers",
) -> Summary:
    """Tokenize JSONL lines (bytes) into sample lines passed to `write`.

    A bad line raises LineError, or with `skip_invalid` is reported and counted.
    """
    import orjson

    from .. import jsonexact
    from ..render import RenderError
    from ..render.base import stray_stop_ids
    from ..render.serving import history_as_served
    from ..render.validate import check_conversation

    dumps, loads = orjson.dumps, jsonexact.loads  # integers beyond 64 bits stay exact
    make = renderer.sample_all_turns if all_turns else renderer.sample
    summary = Summary()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        summary.lines += 1
        try:
            try:
                row = loads(line)
            except orjson.JSONDecodeError as exc:
                raise RenderError(f"not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise RenderError(f"expected a JSON object, got {type(row).__name__}")
            messages, tools = row.get("messages"), row.get("tools") or None
            check_conversation(messages, tools)
            if serving != "transformers" and not all_turns:
                # the history as that stack renders it; the sampled message stays verbatim
                last = messages[-1:] if messages[-1].get("role") == "assistant" else []
                history = messages[: len(messages) - len(last)]
                served = history_as_served(history, serving, renderer.content_format(serving))
                messages = (served or history) + last
            sample = make(messages, tools)
        except RenderError as exc:
            msg = f"{source}:{lineno}: {exc}"
            if not skip_invalid:
                raise LineError(msg) from None
            summary.invalid += 1
            report(f"specgen tokenize: skipped {msg}")
            continue
        stray = stray_stop_ids(sample, renderer.stop_token_ids)
        if stray:
            summary.stray_stops += 1
            report(f"specgen tokenize: warning: {source}:{lineno}: the sampled part holds an "
                   f"end-of-turn token before its end (token {stray[0]}: the message's text "
                   "has a literal stop string); kept as the template renders it, but a model "
                   "stops there")
        out = {"id": row["id"]} if "id" in row else {}
        out["input_ids"] = sample.input_ids
        out["loss_mask"] = sample.loss_mask
        write(dumps(out) + b"\n")
        summary.samples += 1
        summary.tokens += len(sample.input_ids)
        summary.sampled_tokens += sample.loss_mask.count(1)
    return summary


def _open_input(path: str) -> IO[bytes]:
    if path == "-":
        return os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    return open(path, "rb", buffering=1 << 20)


class _AtomicOutput:
    """Buffered writes to `path.tmp`, renamed onto `path` by commit(); removed otherwise."""

    def __init__(self, path: str):
        self.path = path
        self.tmp = None if path == "-" else f"{path}.tmp{os.getpid()}"
        self.committed = False

    def __enter__(self):
        if self.tmp is None:
            self._f = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=1 << 20)
        else:
            self._f = open(self.tmp, "wb", buffering=1 << 20)
        self.write = self._f.write
        return self

    def commit(self) -> None:
        self._f.flush()
        self.committed = True

    def __exit__(self, *exc) -> None:
        self._f.close()
        if self.tmp is None:
            return
        if self.committed:
            os.replace(self.tmp, self.path)
        else:
            os.unlink(self.tmp)
