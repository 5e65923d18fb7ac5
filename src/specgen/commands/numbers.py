"""Numeric command-line options: a value that is not a number, is not finite or is beyond what
the option can hold is refused by argparse (exit 2, the option named), never a traceback later
(a 23-digit `--min-trainable-tokens` once reached the manifest's JSON writer). Each command
still checks the bounds that carry meaning (at least 1, a share in [0, 1], ...)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_WHOLE = 2**63 - 1  # the largest integer the store, the manifests and --json output hold
MAX_IDS = 2**32  # token ids are uint32: no vocabulary is larger


def whole(maximum: int = MAX_WHOLE) -> Callable[[str], int]:
    """An argparse `type`: an integer of at most `maximum` in size."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if abs(value) > maximum:
            raise argparse.ArgumentTypeError(f"{text} is too large (at most {maximum:,})")
        return value

    parse.__name__ = "whole number"
    return parse


def finite(text: str) -> float:
    """An argparse `type`: a finite number (no nan, no inf, no overflow)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


finite.__name__ = "number"
