"""Kimi K2.5 TypeScript-style tool declaration (see docs/renderers.md)."""

from __future__ import annotations

from collections.abc import Sequence

from ..conversation import Tool


def typescript_tool_declaration(tools: Sequence[Tool]) -> str:
    """`# Tools\\n\\n## functions\\nnamespace functions {...}\\n` for OpenAI-format tools."""
    raise NotImplementedError("K2.5 TypeScript tool declaration: being written (issue 2)")
