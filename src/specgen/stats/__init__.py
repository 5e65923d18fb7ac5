"""`specgen stats`: a run's samples described from the store (a reader: never the engine)."""

from .compute import StatsError, StatsOptions, compute_stats

__all__ = ["StatsError", "StatsOptions", "compute_stats"]
