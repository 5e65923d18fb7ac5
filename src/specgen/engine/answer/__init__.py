"""The answer path: named stages from an API answer to a kept, quarantined or rejected one
(`pipeline.STAGES`; docs/design.md, "How an answer travels")."""
