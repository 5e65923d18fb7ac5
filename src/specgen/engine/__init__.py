"""The generation engine (`specgen run`): scheduling, retries, budgets, provider policy,
durable store, resume, stopping and the live view. See docs/engine.md.

Entry point: `specgen.engine.runner.run(cfg, RunOptions(...))`.
"""
