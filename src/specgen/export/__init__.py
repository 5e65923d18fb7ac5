"""Exports a drafter trainer loads unchanged: `tokens` (Parquet/JSONL), `specforge`, `openai`.

`export_run(run_dir, ExportOptions(...))` streams from the store; docs/outputs.md describes
each format and the manifest.
"""

from .core import FORMATS, ExportError, ExportOptions, export_run, manifest_path

__all__ = ["FORMATS", "ExportError", "ExportOptions", "export_run", "manifest_path"]
