"""Errors every layer may raise about the user's input, kept apart so that raising one needs
no import of the module that reads that input."""

from __future__ import annotations


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file and the key."""
