"""The canary requests of a probe: the config's own first requests (tool-calling rows first),
or a small built-in tool-call suite when the datasets declare no tools.

Every provider gets the same canaries in the same order, so its answers can be compared with
the reference provider's canary by canary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import DatasetConfig, RunConfig
from ..conversation import Message, Tool
from ..planner import End, TurnRequest, next_request
from ..sources import SourceError, iter_rows

SCAN_ROWS = 2000  # rows read per dataset at most to find canaries
SUITES = ("auto", "config", "builtin")


@dataclass(frozen=True, slots=True)
class Canary:
    """One probe request: a conversation's first request, as a run would send it."""

    id: str  # "<dataset>/<conversation id>" or "builtin/<name>"
    ds: DatasetConfig  # whose sampling and max_tokens it takes
    request: TurnRequest

    @property
    def tools(self) -> list[Tool] | None:
        return self.request.tools

    @property
    def messages(self) -> list[Message]:
        return self.request.messages


def _tool(name: str, description: str, props: dict, required: list[str]) -> Tool:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required,
                       "additionalProperties": False}}}


WEATHER = _tool("get_weather", "Current weather for a city",
                {"city": {"type": "string"}, "unit": {"type": "string",
                                                      "enum": ["celsius", "fahrenheit"]}},
                ["city"])
CONVERT = _tool("convert_currency", "Convert an amount between currencies",
                {"amount": {"type": "number", "minimum": 0},
                 "from": {"type": "string", "description": "ISO code, e.g. EUR"},
                 "to": {"type": "string", "description": "ISO code"}}, ["amount", "from", "to"])
SEARCH = _tool("search_flights", "Search flights between two airports on a date",
               {"origin": {"type": "string"}, "destination": {"type": "string"},
                "date": {"type": "string", "description": "YYYY-MM-DD"},
                "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
               ["origin", "destination", "date"])
REMIND = _tool("create_reminder", "Create a reminder",
               {"text": {"type": "string"}, "minutes_from_now": {"type": "integer",
                                                                 "minimum": 1},
                "tags": {"type": "array", "items": {"type": "string"}}},
               ["text", "minutes_from_now"])
TOOLS = [WEATHER, CONVERT, SEARCH, REMIND]

# (name, user message): most clearly need a tool; a few need none (false triggers count).
BUILTIN_PROMPTS = (
    ("weather", "What's the weather in Lyon right now, in celsius?"),
    ("convert", "How much is 250 EUR in JPY?"),
    ("flights", "Find me flights from SFO to NRT on 2026-05-14 for 2 people."),
    ("remind", "Remind me to call the bank in 45 minutes."),
    ("weather_two", "Is it raining in Oslo? And what about Bergen?"),
    ("no_tool_math", "What is 17 times 23? Answer directly."),
    ("convert_usd", "Convert 1200 USD to GBP please."),
    ("no_tool_chat", "Write one sentence about autumn."),
    ("remind_tags", "Set a reminder in 10 minutes to stretch, tag it health and routine."),
    ("flights_one", "Any flights from BER to LIS on 2026-07-02?"),
    ("weather_f", "Tell me the current temperature in Denver in fahrenheit."),
    ("convert_chf", "What do 80 CHF come to in euros today?"),
)


def builtin_dataset() -> DatasetConfig:
    """The stand-in dataset of the built-in suite (the run's sampling, its max_tokens)."""
    return DatasetConfig(name="builtin", path=Path("."))


def builtin_canaries() -> list[Canary]:
    ds = builtin_dataset()
    return [Canary(f"builtin/{name}", ds, TurnRequest(
        turn=1, messages=[{"role": "user", "content": text}], tools=TOOLS))
        for name, text in BUILTIN_PROMPTS]


def config_canaries(cfg: RunConfig, *, scan: int = SCAN_ROWS) -> tuple[list[Canary],
                                                                         list[Canary]]:
    """(tool-calling canaries, plain canaries) from the config's datasets, in file order:
    each readable row's first request under its dataset's `turns` and `tool_results`."""
    with_tools: list[Canary] = []
    plain: list[Canary] = []
    for ds in cfg.datasets:
        if getattr(ds, "hub", None) is not None and ds.files is None:
            from ..sources.hub import cached_files

            # a Hub dataset gives canaries once its files are cached (a run or preview
            # --download fetched them); the probe downloads nothing
            ds.files = cached_files(ds.hub, ds.revision, ds.subset, ds.split, ds.name)
        try:
            rows = iter_rows(ds, renderer=cfg.target.renderer)
            for i, row in enumerate(rows):
                if i >= scan:
                    break
                if row.conversation is None:
                    continue
                conv = row.conversation
                step = next_request(conv, {}, ds.turns, ds.tool_results)
                if isinstance(step, End):
                    continue
                canary = Canary(f"{ds.name}/{conv.id}", ds, step)
                (with_tools if step.tools else plain).append(canary)
        except (SourceError, OSError):
            continue  # an unreadable dataset gives no canaries; `specgen preview` says why
    return with_tools, plain


FORM_PLAIN = 2  # canaries without tools kept among tool-calling ones (the plain form)


def canaries(cfg: RunConfig, n: int, suite: str = "auto") -> tuple[list[Canary], str]:
    """`n` canaries and where they came from, in words. `suite`: `config` (the datasets'
    rows only), `builtin` (the built-in tool-call suite only), `auto` (the datasets'
    tool-calling rows, the built-in suite when they have none, then their other rows)."""
    if suite == "builtin":
        return builtin_canaries()[:n], "the built-in tool-call suite"
    tools, plain = config_canaries(cfg)
    if suite == "config":
        return (tools + plain)[:n], "the config's datasets"
    if tools:
        # every answer form the run will see measured (docs/quality.md, "Answer forms"): a
        # few rows without tools (plain answers) besides the tool-calling ones
        k = min(FORM_PLAIN, len(plain), max(0, n - 1))
        return (tools[:n - k] + plain)[:n], "the config's datasets (tool-calling rows first)"
    chosen = (builtin_canaries() + plain)[:n]
    return chosen, ("the built-in tool-call suite (the datasets declare no tools)"
                    + (", then the datasets' rows" if len(chosen) > len(BUILTIN_PROMPTS) else ""))
