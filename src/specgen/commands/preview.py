"""`specgen preview CONFIG [-n N] [--dataset NAME]`: what a run would send, without sending it.

No API call, no money, no run directory: per dataset, the rows read and skipped (with reasons),
whether tools were found, the planned requests with their prompt tokens, the worst-case cost,
and N sample conversations with the exact request body (key redacted) and the prompt as the
target sees it, token by token, with the loss mask. Colour on a terminal; plain text
otherwise (token boundaries as `│`, the loss-mask-1 part between `⟦mask 1⟧ … ⟦/mask 1⟧`);
`--json` for machines. See docs/datasets.md.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys

from .numbers import whole

MAX_SHOWN = 1500  # tokens shown per sample unless --full (head and tail kept)
# Standard colour names, so the alternation survives 16-colour terminals.
PROMPT_STYLES = ("black on white", "black on bright_white")
ANSWER_STYLES = ("black on green", "black on bright_green")
SPECIAL_PROMPT = "bold bright_white on magenta"
SPECIAL_ANSWER = "bold bright_white on blue"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "preview",
        help="show what a run would send (requests, tokens, loss mask, cost) without sending",
        description=(
            "Read the config's datasets and show, per dataset, rows readable and skipped, "
            "tools found, planned requests, estimated prompt tokens, the worst-case cost, and "
            "sample conversations with the exact request JSON and the target's tokens with "
            "the loss mask. Makes no API call and writes nothing."
        ),
    )
    p.add_argument("config", metavar="CONFIG", help="the run's TOML config")
    p.add_argument("-n", type=whole(), default=3, metavar="N",
                   help="sample conversations shown per dataset (default 3)")
    p.add_argument("--dataset", metavar="NAME", help="only this dataset")
    p.add_argument("--scan", type=whole(), default=None, metavar="ROWS",
                   help="rows read per dataset for the counts (default 2000; 0 = all rows; "
                        "longer datasets are extrapolated)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--full", action="store_true",
                   help=f"show every token of long samples (default: at most {MAX_SHOWN})")
    p.add_argument("--no-color", action="store_true", help="plain text even on a terminal")
    p.add_argument("--fetch-prices", action="store_true",
                   help="GET the model's endpoint list for prices (free; off by default so "
                        "preview stays offline)")
    p.add_argument("--download", action="store_true",
                   help="download the files of Hub datasets (hf://) that are not in the cache "
                        "yet, then show their requests (without it, their files and sizes are "
                        "listed and nothing is downloaded)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config import ConfigError, load_config
    from ..engine.resume import pin_for_run_dir
    from ..preview import DEFAULT_SCAN, UnknownDataset, preview
    from ..render import RenderError, mode_renderers, target_renderer
    from ..tokenizer import TokenizerError, load_tokenizer

    if args.n < 0:
        print("specgen preview: -n must be >= 0", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config)
        pin_for_run_dir(cfg)  # a run made before the model-card defaults resumes without
        tokenizer = load_tokenizer(cfg.target.tokenizer, cfg.target.encode)
        renderer = target_renderer(cfg, tokenizer)
    except (ConfigError, TokenizerError, RenderError) as exc:
        print(f"specgen preview: {exc}", file=sys.stderr)
        return 2
    scan = DEFAULT_SCAN if args.scan is None else max(0, args.scan)
    try:
        result = preview(cfg, renderer, n=args.n, dataset=args.dataset, scan=scan,
                         fetch_prices=args.fetch_prices,
                         renderer_for=mode_renderers(renderer, cfg.target.chat_template_kwargs),
                         download=args.download)
    except UnknownDataset as exc:
        print(f"specgen preview: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from ..display import clean_floats

        datasets = []
        for d in result.datasets:  # the sample bodies stay byte for byte what is sent
            fig = d.to_json(result.prices)
            datasets.append({**clean_floats(fig), "samples": fig["samples"]})
        out = {"config": str(cfg.source), "model": cfg.target.model,
               "renderer": cfg.target.renderer, "dialect": result.dialect,
               "prices": clean_floats({**result.prices.to_json(),
                                       "origin": result.price_origin}),
               "worst_case_cost_usd": clean_floats(result.total_cost()),
               "max_cost_usd": result.max_cost_usd,
               **({"live_worst_case_cost_usd": clean_floats(result.total_cost(
                   result.live_prices))} if result.live_prices is not None else {}),
               "sampling": {k: {"value": v, "from": w}
                             for k, (v, w) in result.sampling_defaults.items()},
               "datasets": datasets}
        sys.stdout.write(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    else:
        Printer(cfg, tokenizer, result, color=not args.no_color, full=args.full).print()
    if any(d.error for d in result.datasets):
        return 1
    return _unreadable(result.datasets)


def _unreadable(datasets) -> int:
    """6 (as `specgen run`'s "unproductive") when a dataset read rows but none of them can be
    sent: the run would get nothing from it; 0 otherwise."""
    empty = [d for d in datasets if d.rows_scanned and not d.rows_readable]
    for d in empty:
        print(f"specgen preview: dataset {d.name!r}: none of the {d.rows_scanned:,} row(s) read "
              "is readable (every one invalid, see above): nothing would be sent for it; check "
              "its `format` and fields", file=sys.stderr)
    return 6 if empty else 0


class Printer:
    """Human-readable preview (rich on a terminal, plain text elsewhere)."""

    def __init__(self, cfg, tokenizer, result, *, color: bool, full: bool):
        from rich.console import Console

        self.cfg = cfg
        self.tok = tokenizer
        self.result = result
        self.full = full
        self.console = Console(highlight=False, markup=False, no_color=not color, soft_wrap=True)
        self.styled = color and self.console.is_terminal and not self.console.no_color

    def print(self) -> None:
        c, r = self.console, self.result
        c.print(self._b(f"specgen preview: {self.cfg.source}"))
        c.print(f"  target {self.cfg.target.model}, renderer {self.cfg.target.renderer}, "
                f"thinking {'on' if self.cfg.sampling.thinking else 'off'}, "
                f"request dialect {r.dialect}; nothing is sent")
        c.print(f"  prices {self._prices()}")
        c.print(f"  sampling {self._sampling()}")
        for d in r.datasets:
            self._dataset(d)
        total = r.total_cost()
        c.print()
        if total is None:
            text = "unknown (no prices; see above)"
        else:
            text = f"${total:,.2f}"
            if r.max_cost_usd is not None and total > r.max_cost_usd:
                text += f", but the run stops at [budget] max_cost_usd = ${r.max_cost_usd:,.2f}"
            elif r.max_cost_usd is not None:
                text += f" (within [budget] max_cost_usd = ${r.max_cost_usd:,.2f})"
        stop = next((d for d in r.datasets if d.error is None and d.stops), None)
        if stop is not None:
            text += (f"; but the run stops with an error at the first invalid row of "
                     f"{stop.name} (skip_invalid = false), so it does not get that far")
        if r.live_prices is not None and (live := r.total_cost(r.live_prices)) is not None:
            text += f" at the batch price (live: ${live:,.2f})"
        c.print(self._b("worst case, all datasets: ") + text)

    # -- sections -------------------------------------------------------------------------
    def _dataset(self, d) -> None:
        c = self.console
        c.print()
        c.print(self._b(f"dataset {d.name}") + f"  {d.path}")
        if d.hub:
            self._hub(d)
        if d.error:
            c.print(f"  cannot be read: {d.error}")
            return
        if d.hub_pending:
            return
        c.print(f"  format   {d.format}, turns = {d.turns}")
        if d.sampling or d.n > 1:
            mixes = "; ".join(f"{k} = {json.dumps(v)}" for k, v in d.sampling.items())
            each = f"{d.n} samples per prompt (each its own request)" if d.n > 1 else ""
            c.print(f"  sampling {'; '.join(x for x in (mixes, each) if x)} "
                    "(drawn per task, recorded on each sample)")
        extra = "" if d.complete else (
            f" (first {d.rows_scanned} of ~{d.total_rows} rows; figures below are extrapolated)")
        c.print(f"  rows     {d.rows_scanned} read, {d.rows_readable} readable, "
                f"{d.rows_invalid} invalid{extra}")
        if d.conversations_with_tools:
            names = ", ".join(f"{k} ({v})" for k, v in d.tool_names.most_common(8))
            more = "" if len(d.tool_names) <= 8 else f", +{len(d.tool_names) - 8} more"
            c.print(f"  tools    yes: {d.conversations_with_tools} conversation(s) declare tools, "
                    f"sent as the tools parameter: {names}{more}; "
                    f"{d.dataset_tool_calls} tool call(s) in the data")
        else:
            c.print("  tools    none found")
        limit = f", limit {d.limit:,} conversations" if d.limit is not None else ""
        if d.est_requests_min < d.est_requests:
            planned = (f"{d.est_requests_min:,}–{d.est_requests:,} planned{limit} (tool calls "
                       "decide: a conversation ends early at an answer whose tool calls differ "
                       "from the dataset's; the worst case counts the most)")
        else:
            planned = f"{d.est_requests:,} planned{limit}"
        c.print(f"  requests {'' if d.complete else '~'}{planned}; ~{d.est_prompt_tokens:,} "
                f"prompt tokens (largest prompt {d.max_prompt_tokens:,})")
        cost = d.worst_case_cost(self.result.prices)
        cost_s = f"${cost:,.2f}" if cost is not None else "unknown (no prices)"
        cap = "" if d.token_budget is None else (
            f", capped by token_budget = {d.token_budget:,} completion tokens")
        c.print(f"  worst    {cost_s}: every request answered with max_tokens = {d.max_tokens:,}{cap}")
        label = "skipped " if d.skip_invalid else "invalid "
        for reason, count in d.invalid_reasons.most_common(8):
            c.print(f"  {label} {count:,} x {reason}")
        for ex in d.invalid_examples[:3]:
            c.print(f"           e.g. {ex}")
        for w in d.warnings:
            c.print(self._warn(f"  warning  {w}"))
        for i, s in enumerate(d.samples, 1):
            self._sample(i, len(d.samples), s, d.max_tokens)

    def _hub(self, d) -> None:
        h, c = d.hub, self.console
        c.print(f"  hub      {h['describe']} ({h['layout']}); {len(h['files'])} file(s), "
                f"{h['total_size']:,} bytes")
        for f in h["files"]:
            size = "?" if f["size"] is None else f"{f['size']:,} bytes"
            c.print(f"           {f['path']}  {size}  "
                    f"{'cached' if f['cached'] else 'to download'}")
        if d.hub_pending:
            c.print(f"  rows     not read: {d.hub_pending}")

    def _sample(self, i: int, n: int, s, max_tokens: int) -> None:
        from rich.json import JSON

        c = self.console
        c.print()
        c.print(self._b(f"  sample {i}/{n}") + f": conversation {s.conversation_id} (row {s.row}), "
                f"regenerating message {s.turn}")
        c.print(f"  POST {s.url}")
        for k, v in s.headers.items():
            c.print(f"  {k}: {v}")
        body = json.dumps(s.body, ensure_ascii=False, indent=2)
        if self.styled:
            c.print(JSON(body, indent=2))
        else:
            c.print(body)
        if s.sampling:
            c.print(f"  sampling {_describe(s.sampling)}")
        n_answer = len(s.input_ids) - s.n_prompt
        what = ("the dataset's own answer stands in for the model's" if s.answer == "dataset"
                else "the model's answer goes here")
        c.print(f"  tokens: {s.n_prompt} prompt (loss mask 0) + "
                f"{n_answer if s.answer == 'dataset' else f'up to {max_tokens}'} "
                f"answer (loss mask 1; {what})")
        c.print(self._tokens(s, max_tokens), soft_wrap=True)

    # -- the token view -------------------------------------------------------------------
    def _tokens(self, s, max_tokens: int):
        from rich.text import Text

        ids = s.input_ids
        keep = range(len(ids))
        gap: tuple[int, int] | None = None
        if not self.full and len(ids) > MAX_SHOWN:
            head, tail = MAX_SHOWN * 2 // 3, MAX_SHOWN // 3
            gap = (head, len(ids) - tail)
            keep = [*range(head), *range(len(ids) - tail, len(ids))]
        pieces = _token_texts(self.tok, ids)
        specials = self.tok.id_to_special
        text = Text()
        plain: list[str] = []
        in_answer = False
        for j in keep:
            if gap and j == gap[1]:
                marker = f" … {gap[1] - gap[0]} tokens not shown (--full) … "
                text.append(marker, style="italic")
                plain.append(marker)
            answer = j >= s.n_prompt
            if answer and not in_answer:
                plain.append("⟦mask 1⟧")
                in_answer = True
            shown = pieces[j].replace("\n", "↵\n").replace("\t", "→")
            if ids[j] in specials:
                style = SPECIAL_ANSWER if answer else SPECIAL_PROMPT
            elif answer:
                style = ANSWER_STYLES[j % 2]
            else:
                style = PROMPT_STYLES[j % 2]
            text.append(shown, style=style)
            plain.append(shown)
        if s.answer == "model":
            note = f"⟨the model's answer: up to {max_tokens} tokens, loss mask 1⟩"
            text.append(note, style="italic " + ANSWER_STYLES[0])
            plain.append("⟦mask 1⟧" + note)
            in_answer = True
        if in_answer:
            plain.append("⟦/mask 1⟧")
        if self.styled:
            legend = Text("  legend: ")
            legend.append("prompt", style=PROMPT_STYLES[0])
            legend.append("tokens", style=PROMPT_STYLES[1])
            legend.append(" ")
            legend.append("<|special|>", style=SPECIAL_PROMPT)
            legend.append(" ")
            legend.append("answer", style=ANSWER_STYLES[0])
            legend.append("tokens", style=ANSWER_STYLES[1])
            legend.append(" (loss mask 1) ")
            legend.append("<|special|>", style=SPECIAL_ANSWER)
            return Text("\n").join([legend, text])
        return "│".join(plain)

    # -- helpers --------------------------------------------------------------------------
    def _sampling(self) -> str:
        """The run-wide temperature / top_p a silent dataset gets, and where each is from."""
        parts = []
        for key, (value, origin) in self.result.sampling_defaults.items():
            parts.append(f"{key} {value if value is not None else 'unset'} ({origin})")
        return ", ".join(parts) + "; recorded on every sample"

    def _prices(self) -> str:
        p = self.result.prices
        if not p.known:
            return self.result.price_origin
        return (f"${p.prompt * 1e6:.2f} prompt / ${p.completion * 1e6:.2f} completion per M "
                f"tokens (from {self.result.price_origin})")

    def _b(self, text: str):
        from rich.text import Text

        return Text(text, style="bold") if self.styled else text

    def _warn(self, text: str):
        from rich.text import Text

        return Text(text, style="bold yellow") if self.styled else text


def _describe(record: dict) -> str:
    """A sample's sampling record in words: each value and where it came from."""
    card, drawn = set(record.get("model_card") or ()), set(record.get("drawn") or ())

    def origin(key: str) -> str:
        return " (model card)" if key in card else " (drawn)" if key in drawn else ""

    parts = [f"{k} {record[k]}{origin(k)}" for k in ("temperature", "top_p")
             if record.get(k) is not None]
    parts.append(f"thinking {'on' if record.get('thinking') else 'off'}{origin('reasoning')}")
    return ", ".join(parts)


def _token_texts(tok, ids: list[int]) -> list[str]:
    """Display text per token: bytes decoded incrementally, so a character split over several
    tokens shows on the token that completes it (the others show as '')."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    specials = tok.id_to_special
    out: list[str] = []
    for i in ids:
        if i in specials:
            out.append(dec.decode(b"", final=True) + specials[i])
            dec.reset()
        else:
            out.append(dec.decode(tok.token_bytes(i)))
    return out

