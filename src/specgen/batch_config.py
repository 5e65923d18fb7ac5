"""The checks of `[endpoint] mode = "batch"` (docs/batch.md), kept out of config.py.

`check_batch` runs after the endpoint table is built: it refuses what the batch path cannot
do, with a message naming the key, and fills in the defaults that depend on batch mode.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError

log = logging.getLogger("specgen.config")

# Each batch API's limits (lines, bytes per batch): OpenAI's 50,000 lines and 200 MB per
# input file (Moonshot's file limit is 100 MB, the default of batch_max_bytes); OpenRouter's
# 5,000 requests and 200 MB per inline batch.
LIMITS = {"openai": (50_000, 200 * 1024 * 1024), "openrouter": (5_000, 200 * 1024 * 1024)}
WINDOW = re.compile(r"[1-9][0-9]*h")
PATH = re.compile(r"[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*")
DEFAULT_PRICE_FACTOR = 0.5
# Batch APIs that fix sampling: (host suffix, model slug part) -> the body keys they refuse.
# Moonshot's K2.5 batches apply the model's own values (temperature 1.0 thinking / 0.6
# instant, top_p 0.95: the model card's, which the sample records).
FIXED_SAMPLING: dict[tuple[str, str], tuple[str, ...]] = {
    ("moonshot.ai", "kimi-k2.5"): ("temperature", "top_p", "n", "presence_penalty",
                                   "frequency_penalty"),
    ("moonshot.cn", "kimi-k2.5"): ("temperature", "top_p", "n", "presence_penalty",
                                   "frequency_penalty"),
}


def fixed_sampling(cfg: Any) -> tuple[str, ...]:
    """The body keys this endpoint's batch API fixes (never sent in a batch line)."""
    if cfg.endpoint.mode != "batch":
        return ()
    host = (urlsplit(cfg.endpoint.base_url[0]).hostname or "").lower()
    model = cfg.target.model.lower()
    for (suffix, slug), keys in FIXED_SAMPLING.items():
        if (host == suffix or host.endswith("." + suffix)) and slug in model:
            return keys
    return ()


def price_factor(budget: Any) -> float:
    """The batch price as a share of the live price (`[budget] batch_price_factor`)."""
    f = budget.batch_price_factor
    return DEFAULT_PRICE_FACTOR if f is None else float(f)


def check_batch(cfg: Any, endpoint_raw: dict[str, Any], where: str) -> None:
    ep = cfg.endpoint
    max_requests, max_bytes = LIMITS[ep.batch_api]
    if len(ep.base_url) > 1:
        raise ConfigError(f"{where}: endpoint.base_url: mode = \"batch\" submits every batch "
                          "to one API; give one base URL")
    if not 1 <= ep.batch_max_requests <= max_requests:
        raise ConfigError(f"{where}: endpoint.batch_max_requests must be between 1 and "
                          f"{max_requests:,} (the limit of batch_api = {ep.batch_api!r}), got "
                          f"{ep.batch_max_requests}")
    if not 1024 <= ep.batch_max_bytes <= max_bytes:
        raise ConfigError(f"{where}: endpoint.batch_max_bytes must be between 1024 and "
                          f"{max_bytes:,} (200 MB, the limit of batch_api = "
                          f"{ep.batch_api!r}), got {ep.batch_max_bytes}")
    if not isinstance(ep.completion_window, str) or not WINDOW.fullmatch(ep.completion_window):
        raise ConfigError(f"{where}: endpoint.completion_window must be hours like \"24h\", "
                          f"got {ep.completion_window!r}")
    for key in ("batch_poll_interval", "batch_linger_s"):
        value = getattr(ep, key)
        if not value > 0:
            raise ConfigError(f"{where}: endpoint.{key} must be > 0 seconds, got {value}")
    for key in ("batch_files_path", "batch_batches_path"):
        value = getattr(ep, key)
        if not PATH.fullmatch(value):
            raise ConfigError(f"{where}: endpoint.{key} must be a path under base_url like "
                              f"\"files\" or \"v2/batches\" (no leading /, no query), got "
                              f"{value!r}")
    if not ep.batch_file_purpose.strip():
        raise ConfigError(f"{where}: endpoint.batch_file_purpose must not be empty")
    if "stream" in endpoint_raw and ep.stream:
        # a live config switched to batch mode keeps its `stream = true`: the first try works
        log.warning("%s: endpoint.stream = true has no effect with mode = \"batch\" (a batch "
                    "line is never streamed); the run sends non-stream bodies", where)
    fixed = fixed_sampling(cfg)
    if fixed:
        _check_fixed(cfg, fixed, where)
    ep.stream = False  # a batch line's body is the live non-stream body
    if "concurrency" not in endpoint_raw:
        # in batch mode `concurrency` is the lines waiting in submitted batches
        ep.concurrency = ep.batch_max_requests
        ep.min_concurrency = min(ep.min_concurrency, ep.concurrency)


def _check_fixed(cfg: Any, fixed: tuple[str, ...], where: str) -> None:
    why = (f"the batch API of {cfg.endpoint.base_url[0]} fixes {', '.join(fixed)} for "
           f"{cfg.target.model} (it refuses a batch that sets them and applies the model's "
           "own values); remove the key")
    s = cfg.sampling
    for key in ("temperature", "top_p"):
        if key in fixed and getattr(s, key) is not None:
            raise ConfigError(f"{where}: sampling.{key}: {why}")
    for key in fixed:
        if key in s.extra:
            raise ConfigError(f"{where}: sampling.extra.{key}: {why}")
    for i, ds in enumerate(cfg.datasets):
        if "temperature" in fixed and ds.temperature is not None:
            raise ConfigError(f"{where}: dataset[{i}] ({ds.name!r}).temperature: {why}")
