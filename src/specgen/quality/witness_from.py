"""`[quality] witness_from = PATH`: the prompt deltas a probe measured per provider and request
shape (`probe.json`'s `providers[].prompt_shapes`: {answering provider: {shape: delta}}), so a
run judges its first answers at once instead of holding them pending (docs/quality.md)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .forms import FORMS


def read_deltas(path: Path) -> list[tuple[str, str, int]]:
    """(provider, shape, delta) of a probe.json; ConfigError with a clear message when the
    file is not one."""
    out = []
    for row in _rows(path):
        shapes = row.get("prompt_shapes") if isinstance(row, dict) else None
        if not isinstance(shapes, dict):
            continue  # a probe written before the prompt side was measured per shape
        for provider, by_shape in shapes.items():
            if not isinstance(by_shape, dict):
                continue
            for shape, delta in by_shape.items():
                if _int(delta) and provider:
                    out.append((str(provider), str(shape), delta))
    return out


def read_offsets(path: Path) -> dict[tuple[str, str], int]:
    """{(provider, answer form): completion counting offset} a probe.json measured
    (`completion_offsets_by_form`; a probe written before it measured forms: its
    `completion_offsets`, taken as the plain form's)."""
    out: dict[tuple[str, str], int] = {}
    for row in _rows(path):
        if not isinstance(row, dict):
            continue
        offsets = row.get("completion_offsets")
        if isinstance(offsets, dict):
            out.update({(str(p), "plain"): d for p, d in offsets.items() if p and _int(d)})
        by_form = row.get("completion_offsets_by_form")
        if isinstance(by_form, dict):
            for p, forms in by_form.items():
                if p and isinstance(forms, dict):
                    out.update({(str(p), str(f)): d for f, d in forms.items()
                                if f in FORMS and _int(d)})
    return out


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rows(path: Path) -> list:
    """The probe.json's `providers` list; ConfigError when the file is not a probe.json."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"quality.witness_from: cannot read {path} as JSON ({exc})") from None
    rows = data.get("providers") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ConfigError(f"quality.witness_from: {path} is not a probe.json of `specgen "
                          "probe` (no 'providers' list)")
    return rows
