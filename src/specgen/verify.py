"""`specgen verify`: re-check every stored sample against a fresh render.

For each sample the run's renderer re-renders the stored request (messages + tools as sent)
and the normalised answer, and the stored ids must equal that render exactly:

* `blob`        the stored ids and JSON decode at all (a truncated blob fails here)
* `vocab`       every id lies inside the tokenizer's vocabulary
* `mask`        n_prompt (the mask-0 run) equals the length of the rendered prompt, so the
                loss mask covers exactly the sampled part
* `prompt_ids` / `completion_ids`   the two parts equal the render, id by id
* `text`        the ids decode to the rendered text (prompt and completion separately)
* `specials`    the completion holds exactly one stop token, at its end; tool-call markers are
                balanced and as many as the message's tool calls; special-token counts of
                the prompt equal the render's
* `parse`       parsing the completion ids gives back the stored message

Where the backend returned true ids, their agreement with ours is a measurement: the share
of samples whose prompt and completion ids equal ours exactly. It counts as a failure only
beyond `max_true_mismatch` (docs/outputs.md explains the default and the simulator's raw mode).

Per answering provider (and base URL, from the sample's successful attempt) verify also counts
the samples by `count_check` (what the provider's own token counts said of them) and, where
true ids exist, the reconstruction rate (ours == theirs, prompt and completion separately)
with the first differing token of each mismatch, and how the count witness's verdict on our
ids (`witness:<verdict>` in `repairs`) compares with the truth. None of that changes the exit
status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import witness_sides
from .conversation import AssistantMessage
from .display import UNKNOWN_PROVIDER
from .export.snapshot import read_snapshot
from .judgement import judge
from .quality.repairs import sampled_form
from .queries import detail_text, quarantine_details
from .store import ResultRow, decode_result_row

EXIT_NO_SAMPLES = 6  # nothing to verify (the run's exit 6, `unproductive`)

DEFAULT_MAX_TRUE_MISMATCH = 0.02
SHOW = 5  # examples kept per check / per true-id kind
MISMATCH_LIST = 20  # first differing tokens listed per provider
COUNT_CHECKS = ("exact", "repaired", "unverified", "mismatch", "true_ids")

# Kimi-family tool-call markers: (open, close) pairs that must balance, and the per-call ones.
TOOL_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
TOOL_CALL = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")


class VerifyError(Exception):
    """The run cannot be verified at all (no store, tokenizer missing or different)."""


@dataclass
class Problem:
    check: str
    task: int | None
    dataset: str | None
    conv_id: str | None
    turn: int | None
    detail: str


@dataclass
class TrueIdStats:
    """Agreement of our ids with the ids the backend reported (one kind: prompt/completion)."""

    checked: int = 0
    equal: int = 0
    equal_but_stop: int = 0  # equal once the final stop token is left out (backend omits it)
    same_text: int = 0  # differ as ids but decode to the same text (another segmentation)
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mismatched(self) -> int:
        return self.checked - self.equal - self.equal_but_stop

    @property
    def mismatch_rate(self) -> float:
        return self.mismatched / self.checked if self.checked else 0.0


@dataclass
class IdMatch:
    """Reconstruction of one part (prompt or completion) for one provider."""

    checked: int = 0
    equal: int = 0  # ours == theirs
    equal_but_stop: int = 0  # theirs lacks only our final stop token (counted as a match)

    @property
    def mismatched(self) -> int:
        return self.checked - self.equal - self.equal_but_stop

    @property
    def rate(self) -> float | None:
        """Share reconstructed (equal, or equal but the stop token); None without true ids."""
        return (self.equal + self.equal_but_stop) / self.checked if self.checked else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mismatched": self.mismatched, "rate": self.rate}


@dataclass
class ProviderCheck:
    """What one answering provider's samples say: count_check verdicts, true-id agreement."""

    provider: str
    base_url: str | None
    samples: int = 0
    count_checks: Counter = field(default_factory=Counter)  # "unchecked": stored before it
    prompt: IdMatch = field(default_factory=IdMatch)
    completion: IdMatch = field(default_factory=IdMatch)
    mismatches: list[dict[str, Any]] = field(default_factory=list)  # first MISMATCH_LIST
    # true-id samples: the witness's verdict on our ids -> {"reconstructed": n, "differ": n}
    witness: dict[str, Counter] = field(default_factory=dict)
    # both sides of the count witness (specgen.witness_sides): prompt and completion verdicts
    sides: dict[str, dict[str, int]] = field(default_factory=witness_sides.empty)

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "base_url": self.base_url, "samples": self.samples,
                "count_checks": dict(sorted(self.count_checks.items())),
                "true_ids": {"prompt": self.prompt.to_json(),
                             "completion": self.completion.to_json(),
                             "mismatches": self.mismatches},
                "witness_vs_true_ids": {k: dict(v) for k, v in sorted(self.witness.items())},
                "witness_sides": {part: dict(sorted(c.items()))
                                  for part, c in self.sides.items()}}


@dataclass
class VerifyReport:
    run_dir: str
    renderer: str
    samples: int = 0
    samples_ok: int = 0
    failures: Counter = field(default_factory=Counter)  # check -> samples failing it
    problems: list[Problem] = field(default_factory=list)  # first SHOW per check
    store_problems: list[str] = field(default_factory=list)
    true_prompt: TrueIdStats = field(default_factory=TrueIdStats)
    true_completion: TrueIdStats = field(default_factory=TrueIdStats)
    max_true_mismatch: float = DEFAULT_MAX_TRUE_MISMATCH
    providers: dict[tuple[str, str | None], ProviderCheck] = field(default_factory=dict)
    # answers kept out of the samples: {dataset: {reason: n}}, and each reason's latest figures
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    quarantine_details: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    empty: str | None = None  # no sample to verify: why (specgen.judgement), exit 6

    def provider(self, name: str | None, base_url: str | None) -> ProviderCheck:
        key = (name or UNKNOWN_PROVIDER, base_url)
        if key not in self.providers:
            self.providers[key] = ProviderCheck(*key)
        return self.providers[key]

    @property
    def true_ids_ok(self) -> bool:
        return all(s.mismatch_rate <= self.max_true_mismatch
                   for s in (self.true_prompt, self.true_completion))

    @property
    def ok(self) -> bool:
        return not self.failures and not self.store_problems and self.true_ids_ok

    @property
    def exit_code(self) -> int:
        if self.empty:
            return EXIT_NO_SAMPLES
        return 0 if self.ok else 1

    def add_sample(self, problems: list[Problem]) -> None:
        """Record one sample's problems: counted once per failing check."""
        if not problems:
            self.samples_ok += 1
            return
        by_check: dict[str, list[Problem]] = {}
        for p in problems:
            by_check.setdefault(p.check, []).append(p)
        for check, ps in by_check.items():
            self.failures[check] += 1
            if self.failures[check] <= SHOW:
                first = ps[0]
                if len(ps) > 1:
                    first.detail = "; ".join(p.detail for p in ps)
                self.problems.append(first)

    def to_json(self) -> dict[str, Any]:
        def stats(s: TrueIdStats) -> dict[str, Any]:
            return {**asdict(s), "mismatched": s.mismatched, "mismatch_rate": s.mismatch_rate}

        return {
            "run_dir": self.run_dir, "renderer": self.renderer, "ok": self.ok,
            "samples": self.samples, "samples_ok": self.samples_ok,
            "failures": dict(self.failures), "problems": [asdict(p) for p in self.problems],
            "store_problems": self.store_problems,
            "true_ids": {"prompt": stats(self.true_prompt),
                         "completion": stats(self.true_completion),
                         "max_mismatch_rate": self.max_true_mismatch, "ok": self.true_ids_ok},
            "providers": [self.providers[k].to_json() for k in sorted(
                self.providers, key=lambda k: (k[0], k[1] or ""))],
            "quarantined": self.quarantined, "quarantine_details": self.quarantine_details,
            "empty": self.empty,
        }


def run_tokenizer_and_renderer(meta: dict[str, str], tokenizer: str | None = None):
    """The run's tokenizer and renderer from its meta (or `tokenizer` overriding the path)."""
    from .render import RenderError, get_renderer, template_switches
    from .tokenizer import TokenizerError, load_tokenizer

    try:
        config = orjson.loads(meta.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        config = {}
    spec = tokenizer or (config.get("target") or {}).get("tokenizer")
    if not spec:
        raise VerifyError("the run's config names no tokenizer; pass --tokenizer PATH")
    try:
        tok = load_tokenizer(spec, (config.get("target") or {}).get("encode") or "whole")
    except TokenizerError as exc:
        raise VerifyError(f"cannot load the run's tokenizer: {exc} (pass --tokenizer PATH)") from None
    want = meta.get("tokenizer_fingerprint")
    if want and tok.fingerprint != want:
        raise VerifyError(
            f"tokenizer at {spec} differs from the one the run used (fingerprint "
            f"{tok.fingerprint[:12]} vs {want[:12]}); pass --tokenizer with the run's files")
    name = meta.get("renderer") or (config.get("target") or {}).get("renderer")
    if not name:
        raise VerifyError("the run's meta names no renderer")
    try:
        thinking = parse_flag(meta.get("thinking"), True)
        switches = template_switches(
            thinking, (config.get("target") or {}).get("chat_template_kwargs") or {})
        return tok, get_renderer(name, tok, thinking=thinking, chat_template_kwargs=switches)
    except RenderError as exc:
        raise VerifyError(str(exc)) from None


def _modes(meta: dict[str, str], renderer):
    """thinking -> the run's renderer in that mode (for samples of a reasoning mix)."""
    from .render import mode_renderers

    try:
        config = orjson.loads(meta.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        config = {}
    return mode_renderers(renderer, (config.get("target") or {}).get("chat_template_kwargs"))


def parse_flag(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def verify_run(run_dir: str | Path, *, tokenizer: str | None = None,
               datasets: Sequence[str] | None = None,
               max_true_mismatch: float = DEFAULT_MAX_TRUE_MISMATCH) -> VerifyReport:
    """Check every stored sample of a run (consistent snapshot; safe while it runs)."""
    with read_snapshot(run_dir) as store:
        meta = store.meta()
        tok, renderer = run_tokenizer_and_renderer(meta, tokenizer)
        report = VerifyReport(run_dir=str(run_dir), renderer=renderer.name,
                              max_true_mismatch=max_true_mismatch)
        checker = SampleChecker(tok, renderer, renderer_for=_modes(meta, renderer))
        base_urls = BaseUrls(store)
        for raw in store.iter_result_tuples(datasets):
            report.samples += 1
            # raw columns (RESULT_COLUMNS): 0 task, 5 provider, 22 count_check
            pc = report.provider(raw[5], base_urls.of(raw[0], raw[5]))
            pc.samples += 1
            pc.count_checks[raw[22] or "unchecked"] += 1
            try:
                row = decode_result_row(raw)
            except Exception as exc:  # noqa: BLE001 - any decoding error is a bad blob
                report.add_sample([Problem("blob", raw[0], raw[3], raw[2], raw[4],
                                           f"stored sample cannot be decoded: {exc}")])
                continue
            witness_sides.add(pc.sides, row.prompt_check, row.completion_check,
                              row.prompt_delta)
            report.add_sample(checker.check(row, report, pc))
        report.store_problems = store_consistency(store)
        report.quarantined = store.quarantine_counts()
        report.quarantine_details = quarantine_details(store)
        if not report.samples:
            report.empty = (judge(store, datasets).verdict
                            or "the run has no sample yet (nothing answered so far)")
    return report


class BaseUrls:
    """The base URL a sample came from: that of its task's successful attempt (by the same
    provider, the latest when a merge re-pointed several); None where no attempt says."""

    def __init__(self, store):
        self.conn = store.conn
        try:
            n = self.conn.execute("SELECT COUNT(*) FROM (SELECT DISTINCT base_url FROM "
                                  "attempts WHERE outcome = 'ok')").fetchone()[0]
            self.only = (self.conn.execute("SELECT MAX(base_url) FROM attempts WHERE outcome "
                                           "= 'ok'").fetchone()[0] if n == 1 else None)
            self.many = n > 1
        except Exception:  # noqa: BLE001 - a store without attempts: no base URLs
            self.only, self.many = None, False

    def of(self, task: int, provider: str | None) -> str | None:
        if not self.many:
            return self.only
        row = self.conn.execute(
            "SELECT base_url FROM attempts WHERE task = ? AND outcome = 'ok' "
            "ORDER BY provider IS ? DESC, id DESC LIMIT 1", (task, provider)).fetchone()
        return row[0] if row else None


def store_consistency(store) -> list[str]:
    """Cross-table checks: every done task has exactly one sample and vice versa."""
    out = []
    n = store.conn.execute(
        "SELECT COUNT(*) FROM tasks t LEFT JOIN results r ON r.task = t.id "
        "WHERE t.status = 'done' AND r.task IS NULL").fetchone()[0]
    if n:
        out.append(f"{n} task(s) marked done have no stored sample")
    n = store.conn.execute(
        "SELECT COUNT(*) FROM results r LEFT JOIN tasks t ON t.id = r.task "
        "WHERE t.id IS NULL OR t.status != 'done' OR t.conversation != r.conversation "
        "OR t.turn != r.turn").fetchone()[0]
    if n:
        out.append(f"{n} stored sample(s) do not match a done task (conversation/turn)")
    return out


class SampleChecker:
    """The per-sample checks (see the module docstring)."""

    def __init__(self, tok, renderer, renderer_for=None):
        self.tok = tok
        self.renderer = renderer
        self.base = renderer
        # thinking -> renderer: a sample drawn from a reasoning mix is checked in its own mode
        self.renderer_for = renderer_for or (lambda _thinking: renderer)
        self.stop_ids = renderer.stop_token_ids
        sp = tok.special_tokens
        self.section = tuple(sp.get(t) for t in TOOL_SECTION)
        self.call = tuple(sp.get(t) for t in TOOL_CALL)

    def check(self, row: ResultRow, report: VerifyReport,
              pc: ProviderCheck | None = None) -> list[Problem]:
        """The problems of one sample (empty when it passes); true ids go into `report`
        (and into its provider's `pc`)."""
        problems: list[Problem] = []
        thinking = (row.sampling or {}).get("thinking")
        self.renderer = (self.base if not isinstance(thinking, bool)
                         or thinking == self.base.thinking else self.renderer_for(thinking))

        def problem(check: str, detail: str) -> None:
            problems.append(Problem(check, row.task, row.dataset, row.conv_id, row.turn, detail))

        ids, n_prompt = row.input_ids, row.n_prompt
        vocab = self.tok.vocab_size
        bad = [i for i in ids if i >= vocab]
        if bad:
            problem("vocab", f"{len(bad)} id(s) outside the vocabulary (size {vocab}), e.g. {bad[0]}")
            return problems
        messages = list(row.request.get("messages") or [])
        tools = row.request.get("tools") or None
        try:
            sample = self.renderer.sample([*messages, row.message], tools)
            prompt_text = self.renderer.render_text(messages, tools, add_generation_prompt=True)
            # the form the model sampled, as the count witness found it (quality.repairs,
            # `sampled_form`): the canonical completion unless a repair names another
            form = sampled_form(row.repairs)
            variants = self.renderer.completion_variants(row.message, context=messages,
                                                         tools=tools)
            if form not in variants:
                problem("render", f"the stored sampled form {form!r} is not one of this "
                                  f"message's forms ({', '.join(variants)})")
                return problems
            completion_text = variants[form]
        except Exception as exc:  # noqa: BLE001 - a sample that cannot be re-rendered is wrong
            problem("render", f"cannot re-render the stored request: {exc}")
            return problems
        want_prompt = sample.input_ids[: sample.n_prompt]
        want_completion = (sample.input_ids[sample.n_prompt:] if form == "canonical" else
                           self.renderer.encode_completion(completion_text, context=messages,
                                                           tools=tools))
        truncated = row.finish_reason == "length"  # kept at max_tokens: no stop token sampled
        if truncated:
            want_completion = self._truncated(row, messages, tools, ids[sample.n_prompt:])
            completion_text = self.tok.decode(want_completion)
        if not 0 <= n_prompt <= len(ids):
            problem("mask", f"n_prompt {n_prompt} outside the sample (length {len(ids)})")
            return problems
        if n_prompt != len(want_prompt):
            problem("mask", f"n_prompt is {n_prompt} but the prompt renders to "
                            f"{len(want_prompt)} tokens: the loss mask does not cover exactly "
                            "the sampled part")
        got_prompt, got_completion = ids[:n_prompt], ids[n_prompt:]
        if ids[: len(want_prompt)] != want_prompt:
            problem("prompt_ids", self._diff(ids[: len(want_prompt)], want_prompt))
        if ids[len(want_prompt):] != want_completion:
            problem("completion_ids", self._diff(ids[len(want_prompt):], want_completion))
        if self.tok.decode(got_prompt) != prompt_text:
            problem("text", "prompt ids do not decode to the rendered prompt text")
        if self.tok.decode(got_completion) != completion_text:
            problem("text", "completion ids do not decode to the rendered completion text")
        self._check_specials(row, got_prompt, want_prompt, got_completion, problem, truncated)
        self._check_parse(row, got_completion, problem)
        self._true_ids(row, got_prompt, got_completion, report, pc)
        return problems

    def _truncated(self, row: ResultRow, messages, tools, got: list[int]) -> list[int]:
        """What the model sampled for an answer cut at max_tokens (normalize's rule: the
        completion less its stop token, and less `</think>` when it stopped mid-reasoning)."""
        from .normalize import Normalized, sampled_completion_ids

        msg = AssistantMessage.from_openai(row.message)
        options = [sampled_completion_ids(
            self.renderer, Normalized(msg, truncated=True, reasoning_closed=closed),
            context=messages, tools=tools) for closed in (True, False)]
        return next((o for o in options if o == got), options[0])

    def _check_specials(self, row, got_prompt, want_prompt, completion, problem,
                        truncated: bool) -> None:
        stops = [i for i, t in enumerate(completion) if t in self.stop_ids]
        if truncated:
            if stops:
                problem("specials", f"answer cut at max_tokens holds {len(stops)} stop token(s)")
        elif len(stops) != 1 or stops[0] != len(completion) - 1:
            problem("specials", f"completion holds {len(stops)} stop token(s)"
                                f"{' not at its end' if len(stops) == 1 else ''}; expected one, last")
        calls = len(row.message.get("tool_calls") or ())
        if not truncated:  # a cut answer may end inside a tool-call section
            if None not in self.section:
                opens, closes = (completion.count(t) for t in self.section)
                # a form sampled without the section end closes none (quality.repairs)
                closed = "no_section_end" not in sampled_form(row.repairs).split("+")
                if opens != (1 if calls else 0) or closes != (opens if closed else 0):
                    problem("specials", f"tool-call section markers {opens} open / {closes} "
                                        f"close for {calls} tool call(s)")
            if None not in self.call:
                counts = [completion.count(t) for t in self.call]
                if any(c != calls for c in counts):
                    problem("specials", f"tool-call markers begin/argument/end {counts} for "
                                        f"{calls} tool call(s)")
        specials = self.tok.id_to_special
        got = Counter(t for t in got_prompt if t in specials)
        want = Counter(t for t in want_prompt if t in specials)
        if got != want:
            diff = {specials[t]: got[t] - want[t] for t in set(got) | set(want) if got[t] != want[t]}
            problem("specials", f"prompt special-token counts differ from the render: {diff}")

    def _check_parse(self, row, completion, problem) -> None:
        try:
            parsed = self.renderer.parse_completion(completion)
        except NotImplementedError:
            return
        except Exception as exc:  # noqa: BLE001
            problem("parse", f"completion ids do not parse: {exc}")
            return
        stored = AssistantMessage.from_openai(row.message)
        mismatch = []
        if parsed.content != stored.content:
            mismatch.append("content")
        if (parsed.reasoning or "") != (stored.reasoning or ""):
            mismatch.append("reasoning")
        if [(c.id, c.arguments) for c in parsed.tool_calls] != [
                (c.id, c.arguments) for c in stored.tool_calls]:
            mismatch.append("tool calls")
        if mismatch:
            problem("parse", f"completion ids parse to a different {', '.join(mismatch)} "
                             "than the stored message")

    def compare(self, kind: str, ours: list[int], theirs: list[int]) -> str:
        """"equal", "equal_but_stop" (theirs lacks only our final stop token: some servers
        leave it out) or "differ"."""
        if theirs == ours:
            return "equal"
        if kind == "completion" and ours and ours[-1] in self.stop_ids and theirs == ours[:-1]:
            return "equal_but_stop"
        return "differ"

    def _true_ids(self, row: ResultRow, prompt, completion, report: VerifyReport,
                  pc: ProviderCheck | None = None) -> None:
        outcomes = []
        for kind, ours, theirs, stats in (
                ("prompt", prompt, row.true_prompt_ids, report.true_prompt),
                ("completion", completion, row.true_completion_ids, report.true_completion)):
            if theirs is None:
                continue
            outcome = self.compare(kind, ours, theirs)
            outcomes.append(outcome)
            stats.checked += 1
            if pc is not None:
                self._record(pc, row, kind, ours, theirs, outcome)
            if outcome == "equal":
                stats.equal += 1
                continue
            if outcome == "equal_but_stop":
                stats.equal_but_stop += 1
                continue
            if self.tok.decode(theirs) == self.tok.decode(ours):
                stats.same_text += 1
            if len(stats.examples) < SHOW:
                stats.examples.append(self._true_example(row, ours, theirs))
        if pc is not None and len(outcomes) == 2:  # the witness measured against the truth
            verdict = next((r.split(":", 1)[1] for r in row.repairs
                            if r.startswith("witness:")), "none")
            key = "differ" if "differ" in outcomes else "reconstructed"
            pc.witness.setdefault(verdict, Counter())[key] += 1

    @staticmethod
    def _record(pc: ProviderCheck, row: ResultRow, kind: str, ours, theirs,
                outcome: str) -> None:
        m = pc.prompt if kind == "prompt" else pc.completion
        m.checked += 1
        if outcome == "equal":
            m.equal += 1
        elif outcome == "equal_but_stop":
            m.equal_but_stop += 1
        elif len(pc.mismatches) < MISMATCH_LIST:
            at = first_diff(ours, theirs)
            pc.mismatches.append({
                "task": row.task, "dataset": row.dataset, "conv_id": row.conv_id,
                "turn": row.turn, "kind": kind, "index": at,
                "ours": ours[at] if at < len(ours) else None,
                "theirs": theirs[at] if at < len(theirs) else None,
                "ours_len": len(ours), "theirs_len": len(theirs)})

    def _true_example(self, row: ResultRow, ours, theirs) -> dict[str, Any]:
        at = first_diff(ours, theirs)
        i, j = self._realign(ours, theirs, at)
        return {
            "task": row.task, "dataset": row.dataset, "conv_id": row.conv_id, "turn": row.turn,
            "position": at, "ours_len": len(ours), "theirs_len": len(theirs),
            "context": self.tok.decode(ours[max(0, at - 4): at]),
            "ours": ours[at:i], "theirs": theirs[at:j],
            "ours_pieces": [self._piece(t) for t in ours[at:i]],
            "theirs_pieces": [self._piece(t) for t in theirs[at:j]],
        }

    def _piece(self, token: int) -> str:
        try:
            return self.tok.token_bytes(token).decode("utf-8", errors="backslashreplace")
        except Exception:  # noqa: BLE001 - an id outside the vocabulary
            return f"<id {token}>"

    def _realign(self, ours, theirs, at: int, limit: int = 64) -> tuple[int, int]:
        """End indexes (exclusive) of the shortest spans from `at` that cover the same bytes,
        i.e. the first token boundary the two segmentations share again."""
        def ends(ids):
            out, n = {}, 0
            for k in range(at, min(len(ids), at + limit)):
                try:
                    n += len(self.tok.token_bytes(ids[k]))
                except Exception:  # noqa: BLE001
                    break
                out[n] = k + 1
            return out

        a, b = ends(ours), ends(theirs)
        common = sorted(set(a) & set(b))
        if common:
            return a[common[0]], b[common[0]]
        return min(len(ours), at + 8), min(len(theirs), at + 8)

    def _diff(self, got, want) -> str:
        at = first_diff(got, want)
        lo = max(0, at - 2)
        return (f"differs from the render at token {at} (stored {len(got)} ids, render "
                f"{len(want)}): stored {self.tok.decode(got[lo: at + 4])!r} vs render "
                f"{self.tok.decode(want[lo: at + 4])!r}")


def first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def format_report(r: VerifyReport) -> str:
    """The plain-text summary `specgen verify` prints."""
    lines = [f"verify {r.run_dir}  (renderer {r.renderer})",
             f"  samples checked      {r.samples:,}",
             f"  samples passing      {r.samples_ok:,}"]
    if r.failures:
        lines.append("  failing checks:")
        for check, n in sorted(r.failures.items()):
            lines.append(f"    {check:<16} {n:,} sample(s)")
        lines.append("  first problems:")
        for p in r.problems:
            lines.append(f"    [{p.check}] {p.dataset}/{p.conv_id} turn {p.turn} (task {p.task}): "
                         f"{p.detail}")
    for msg in r.store_problems:
        lines.append(f"  store: {msg}")
    if r.empty:
        lines.append(f"  nothing verified: no sample — {r.empty}")
    for ds, reasons in sorted(r.quarantined.items()):
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            figures = r.quarantine_details.get(ds, {}).get(reason)
            lines.append(f"  quarantined          {ds}: {reason} x{n:,}"
                         + (f" (latest: {detail_text(figures)})" if figures else ""))
    for kind, s in (("prompt", r.true_prompt), ("completion", r.true_completion)):
        if not s.checked:
            lines.append(f"  {'true ' + kind + ' ids':<20} none returned by the backend")
            continue
        extra = f", {s.equal_but_stop} equal without the final stop token" if s.equal_but_stop else ""
        lines.append(f"  {'true ' + kind + ' ids':<20} {s.equal:,}/{s.checked:,} equal ours "
                     f"exactly ({100 * (s.equal + s.equal_but_stop) / s.checked:.2f}% "
                     f"match{extra}); {s.mismatched:,} differ, {s.same_text:,} of them same text")
        for ex in s.examples:
            lines.append(f"    {ex['dataset']}/{ex['conv_id']} turn {ex['turn']}: at token "
                         f"{ex['position']} (after {ex['context']!r}): ours "
                         f"{ex['ours_pieces']} {ex['ours']} vs theirs {ex['theirs_pieces']} "
                         f"{ex['theirs']}")
    if not r.true_ids_ok:
        lines.append(f"  true-id mismatch rate above --max-true-mismatch {r.max_true_mismatch:g}")
    lines += format_providers(r)
    lines.append("NO SAMPLES" if r.empty else "OK" if r.ok else "FAILED")
    return "\n".join(lines)


def _pct(m: IdMatch) -> str:
    if not m.checked:
        return "—"
    return f"{m.equal + m.equal_but_stop:,}/{m.checked:,} ({100 * (m.rate or 0):.2f}%)"


def format_providers(r: VerifyReport) -> list[str]:
    """The per-provider table: samples by count_check; true-id reconstruction per part."""
    if not r.providers:
        return []
    pcs = [r.providers[k] for k in sorted(r.providers, key=lambda k: (k[0], k[1] or ""))]
    seen = {c for pc in pcs for c in pc.count_checks}  # columns that are all 0 are left out
    checks = [c for c in COUNT_CHECKS if c in seen] + sorted(seen - set(COUNT_CHECKS))
    head = ["provider", "base_url", "samples", *checks, "true prompt", "true completion"]
    rows = [[pc.provider, pc.base_url or "—", str(pc.samples),
             *(str(pc.count_checks.get(c, 0)) for c in checks), _pct(pc.prompt),
             _pct(pc.completion)] for pc in pcs]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  per provider (count_check of the samples; true ids: ours == theirs):"]
    for cells in (head, *rows):
        lines.append("    " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                        for i, (c, w) in enumerate(zip(cells, widths,
                                                                       strict=True))).rstrip())
    for pc in pcs:
        where = f"{pc.provider}" + (f" ({pc.base_url})" if pc.base_url else "")
        if any(pc.sides.values()):
            lines.append(f"    {where}: witness sides: {witness_sides.describe(pc.sides)}")
        if set(pc.witness) - {"none"}:  # samples judged by the witness before storing
            lines.append(f"    {where}: witness verdict on our ids vs true ids: " + ", ".join(
                f"{v} {c.get('reconstructed', 0)} reconstructed / {c.get('differ', 0)} differ"
                for v, c in sorted(pc.witness.items())))
        n = pc.prompt.mismatched + pc.completion.mismatched
        if not n:
            continue
        shown = f" (first {len(pc.mismatches)})" if n > len(pc.mismatches) else ""
        lines.append(f"    {where}: {n} true-id mismatch(es){shown}:")
        for m in pc.mismatches:
            lines.append(f"      {m['dataset']}/{m['conv_id']} turn {m['turn']} {m['kind']}: "
                         f"first difference at token {m['index']}: ours {m['ours']} vs "
                         f"theirs {m['theirs']} (lengths {m['ours_len']} / {m['theirs_len']})")
    return lines
