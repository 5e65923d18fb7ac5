"""Resume: rebuild a session's in-memory state from the store — the datasets' cursors and
counters, their spend, the providers' learnt count offsets and exclusions, failed tasks by
class, and the conversations left open (each asked for its next request again)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..conversation import AssistantMessage, Conversation
from ..errors import ConfigError
from ..quality.witness_from import read_deltas, read_offsets
from ..queries import (
    failed_tasks_by_class,
    pending_completions,
    prompt_shape_deltas,
    vouched_deltas,
)
from ..store import unpack_json
from .progress import RowCounter
from .providers import read_excluded
from .redo import redo, reopened
from .state import Conv, DsRun

log = logging.getLogger("specgen.engine")


def load(engine, *, retry_failed: bool = False, ack_alarms: tuple[str, ...] = ()) -> None:
    """Fill a new `Engine` from its store (see the module docstring)."""
    store, cfg = engine.store, engine.cfg
    names = [d.name for d in cfg.datasets]
    if retry_failed:
        n = store.reset_failed_tasks(names)
        if n:
            log.info("--retry-failed: %d failed task(s) made pending again", n)
    redo_at_start(engine)
    engine.failed_classes.update({k: v["count"] for k, v in failed_tasks_by_class(
        store, names).items()})
    for provider, dp, dc, form, sampled in vouched_deltas(store):
        engine.witness.seed(provider, dp, dc, form, sampled=sampled)
    for provider, task, p_check, theirs, dc, n, repairs, form in pending_completions(store):
        engine.witness.seed_open(provider, task, theirs=theirs, delta=dc, stored=n,
                                 prompt_check=p_check or "unverified", repairs=repairs,
                                 form=form)
    for provider, shape, dp, p_check, task, c_check in prompt_shape_deltas(store):
        engine.witness.seed_shape(provider, shape, dp, tools=False, key=task,
                                  pending=p_check == "pending",
                                  completion_check=c_check or "exact")
    _load_probe_deltas(engine, cfg)
    _load_exclusions(engine)
    _load_datasets(engine)
    load_alarms(engine, ack_alarms)
    book = engine.book
    book.next_conv = store.max_id("conversations")
    book.next_task = store.max_id("tasks")
    for row in store.open_conversations():
        reopen(engine, row)
    for ds in engine.datasets:
        book.refresh_state(ds)
        engine.row_counters[ds.name] = RowCounter(ds.cfg.path, ds.cfg.split)


def reopen(engine, row: tuple) -> None:
    """An open conversation of the store back in memory, asked for its next request."""
    store = engine.store
    cid, dsname, _conv_id, row_index, status, data = row
    ds = engine.by_name.get(dsname)
    if ds is None:
        return  # dataset removed from the config: left as it is
    conv = Conv(id=cid, ds=ds, conv=Conversation.from_json(unpack_json(data)),
                row_index=row_index, status=status)
    conv.answers = {t: AssistantMessage.from_openai(m)
                    for t, m in store.answers_of(cid).items()}
    engine.book.hold(conv)
    engine.book.advance(conv, known_tasks=store.tasks_of(cid))


def redo_at_start(engine) -> None:
    """Samples of excluded providers still in the store (a session killed before it redid
    them, or `redo_excluded = "all"` after `specgen provider --exclude`): made again now."""
    if engine.cfg.endpoint.mode == "batch":
        return  # batch lines are matched by conversation and turn: not redone there
    done = redo(engine.store, read_excluded(engine.store.meta()),
                engine.cfg.quality.redo_excluded, session=engine.session_id)
    if done is not None:
        engine.note_redo(done)


def redo_in_session(engine, skip: set[int]) -> bool:
    """At the end of the session's work: the samples of providers excluded meanwhile made
    again, their conversations back in memory (False: nothing to redo)."""
    done = redo(engine.store, engine.policy.excluded, engine.cfg.quality.redo_excluded,
                session=engine.session_id, skip=skip)
    if done is None:
        return False
    engine.note_redo(done)
    store = engine.store
    task_counts, conv_counts = store.task_counts(), store.conversation_counts()
    for ds in engine.datasets:
        ds.tasks = dict(task_counts.get(ds.name, {}))
        ds.convs_by_status = dict(conv_counts.get(ds.name, {}))
    rows = reopened(store.conn, sorted(done.conversation_ids))
    skip.update(done.conversation_ids)
    for row in rows:
        reopen(engine, row)
    for ds in engine.datasets:
        engine.book.refresh_state(ds)
    return True


def _load_exclusions(engine) -> None:
    for name, info in read_excluded(engine.store.meta()).items():
        engine.policy.exclude(name, info)
        engine.quality.policing.mark(name, True)
    if engine.policy.excluded:
        log.warning("excluded providers (from earlier sessions): %s; `specgen provider %s "
                    "--allow NAME` puts one back", ", ".join(engine.policy.excluded),
                    engine.store.path.parent)
        engine.steering.check_routable()


def _load_datasets(engine) -> None:
    store, cfg = engine.store, engine.cfg
    table = store.datasets_table()
    task_counts = store.task_counts()
    conv_counts = store.conversation_counts()
    spend = store.spend()
    for pos, dcfg in enumerate(cfg.datasets):
        old = table.get(dcfg.name, {})
        ds = DsRun(cfg=dcfg, position=pos, max_tokens=cfg.max_tokens_for(dcfg),
                   config_hash=cfg.dataset_result_hash(dcfg))
        ds.rows_read = old.get("rows_read", 0)
        ds.rows_invalid = old.get("rows_invalid", 0)
        ds.rows_duplicate = old.get("rows_duplicate", 0)
        ds.rows_other_shard = old.get("rows_other_shard", 0)
        # A source read to its end before is read again from its cursor: rows appended
        # since then are picked up (skipping the rows read costs little, in a thread).
        ds.exhausted = False
        ds.tasks = dict(task_counts.get(dcfg.name, {}))
        ds.convs_by_status = dict(conv_counts.get(dcfg.name, {}))
        ds.conversations = sum(ds.convs_by_status.values())
        ds.prompts = (ds.conversations if dcfg.n == 1
                      else store.prompts_admitted(dcfg.name))
        ds.stored_at_start = ds.conversations > 0
        s = spend.get(dcfg.name, {})
        engine.budget.add_dataset(
            dcfg.name, dcfg.token_budget, prompt_tokens=int(s.get("prompt_tokens", 0)),
            completion_tokens=int(s.get("completion_tokens", 0)),
            cost_usd=float(s.get("cost_usd", 0.0)))
        engine.datasets.append(ds)
        engine.by_name[dcfg.name] = ds
    # Spend of datasets no longer in the config still counts against the run's dollar cap.
    for name, s in spend.items():
        if name not in engine.by_name and name is not None:
            engine.budget.cost_usd += float(s.get("cost_usd", 0.0))


def load_alarms(engine, ack: tuple[str, ...] = ()) -> None:
    """The alarm windows and fired alarms of earlier sessions (quality.memory): the windows
    refilled so figures run across sessions; a fired alarm whose cause changed is cleared,
    one named by `--ack-alarm` acknowledged, any other stands and is carried out again."""
    import orjson

    from ..quality.memory import META_FIRED, META_WINDOWS, load_windows, read_fired

    meta = engine.store.meta()
    steering, alarms = engine.steering, engine.quality.alarms
    steering.config_json = orjson.loads(orjson.dumps(engine.cfg.to_json()))
    cause = steering.cause
    names = {d.name for d in engine.datasets}
    fired = read_fired(meta.get(META_FIRED))
    changed = False
    for ds, recs in list(fired.items()):
        for name, rec in list(recs.items()):
            if rec.get("cause") != cause:
                del recs[name]
                changed = True
                engine.events.add("alarm_cleared", ds, None,
                                  f"alarm {name}: what it depends on changed")
                log.info("alarm %s on dataset %r cleared: the config or the providers "
                         "changed", name, ds)
                continue
            if name in ack and not rec.get("acked"):
                rec["acked"] = True
                changed = True
                engine.events.add("alarm_acknowledged", ds, None,
                                  f"alarm {name}: --ack-alarm {name}")
                log.warning("alarm %s on dataset %r acknowledged (--ack-alarm): the run goes "
                            "on", name, ds)
            alarms.fired.setdefault(ds, []).append(name)  # fires at most once per cause
        if not recs:
            del fired[ds]
    n = load_windows(alarms, meta.get(META_WINDOWS), names, cause)
    if n:
        log.info("alarm windows: %d answer(s) of earlier sessions restored", n)
    steering.remembered = fired
    if changed:
        steering.save_alarms()
    for ds, recs in fired.items():
        for name, rec in recs.items():
            if not rec.get("acked") and ds in names:
                steering.standing_alarm(ds, name, rec)


def _load_probe_deltas(engine, cfg) -> None:
    """A probe's prompt deltas per provider and request shape: `[quality] witness_from`, else
    the run dir's own probe.json (`specgen probe` writes it there), so the first answers are
    judged at once (docs/quality.md, "Two sides")."""
    path, given = cfg.quality.witness_from, True
    if path is None:
        path, given = Path(cfg.run_dir) / "probe.json", False
        if not path.is_file():
            return
    try:
        learnt, offsets = read_deltas(path), read_offsets(path)
    except ConfigError as exc:
        if given:
            raise
        log.warning("%s (the run dir's probe.json is not used)", exc)
        return
    for provider, shape, delta in learnt:
        engine.witness.shapes.learn(provider, shape, delta, tools=False)
    for (provider, form), offset in offsets.items():
        engine.witness.learn_offset(provider, offset, form)
    log.info("%s %s: %d prompt delta(s) per provider and request shape",
             "witness_from" if given else "probe", path, len(learnt))
