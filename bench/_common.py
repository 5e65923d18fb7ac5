"""What the benchmarks share (not a benchmark itself): pinning processes to cores, starting
`specgen sim`, measuring a child process, the machine note, and the synthetic stores that
the output benches (stats.py, outputs.py) write straight into the store's schema.

A bench imports it after moving its own folder to the end of `sys.path` (bench/tokenize.py
would shadow the standard library's `tokenize` otherwise):

    HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]
    import _common
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")


# -- processes ------------------------------------------------------------------------------
def pin(cpu: int | None):
    """A preexec_fn pinning the child to `cpu` (None: anywhere)."""
    def fn() -> None:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                pass
    return fn


def cpus() -> tuple[int | None, int | None]:
    """(client core, server core) when the machine has two or more; (None, None) otherwise."""
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    avail = sorted(os.sched_getaffinity(0))
    return (avail[0], avail[1]) if len(avail) >= 2 else (None, None)


def env(**extra: str) -> dict[str, str]:
    """The environment for a `python -m specgen` child: this checkout's src first."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": SRC + (os.pathsep + path if path else ""), **extra}


def start_sim(workdir: Path, config_text: str, cpu: int | None):
    """`specgen sim --port 0` with `config_text` as its config, pinned to `cpu`:
    (process, its OpenAI base URL)."""
    cfg = workdir / "sim.toml"
    cfg.write_text(config_text)
    err = (workdir / "sim.err").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "specgen", "sim", "--port", "0", "--config",
                             str(cfg)], stdout=subprocess.PIPE, stderr=err, text=True,
                            cwd=ROOT, preexec_fn=pin(cpu), env=env())
    line = proc.stdout.readline().strip()
    if not line.startswith("specgen sim listening on "):
        proc.kill()
        raise SystemExit(f"sim did not start: {line!r} "
                         f"{(workdir / 'sim.err').read_text()[-2000:]}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, line.rsplit(" ", 1)[1] + "/api/v1"


def rss_mb(pid: int) -> dict[str, float] | None:
    """A live process's resident memory now and at its peak (Linux /proc), in MB."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss_mb" if key == "VmRSS" else "peak_rss_mb"] = round(
                int(value.split()[0]) / 1024, 1)
    return out


def run_measured(cmd: list[str], *, cpu: int | None = None,
                 child_env: dict[str, str] | None = None) -> tuple[int, Any, str, str]:
    """Run `cmd` (pinned to `cpu`) to its end: (wait status, its rusage, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, preexec_fn=pin(cpu), env=child_env)
    box: dict[str, str] = {}
    readers = [threading.Thread(target=lambda: box.update(out=proc.stdout.read())),
               threading.Thread(target=lambda: box.update(err=proc.stderr.read()))]
    for t in readers:
        t.start()
    _, status, ru = os.wait4(proc.pid, 0)
    for t in readers:
        t.join()
    return status, ru, box.get("out", ""), box.get("err", "")


def machine_note() -> str:
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return (f"machine: {platform.machine()}, nproc {os.cpu_count()}, Python "
            f"{platform.python_version()}, {platform.system()} {platform.release()}, "
            f"load average {load}")


def run_config(path: Path, *, run_dir: Path, model: str, url: str, data: Path, n: int,
               endpoint: str = "", sampling: str = "max_tokens = 1024",
               engine: str = "log_interval = 30") -> Path:
    """Write a `specgen run` config at `path`: one dataset `bench` (`data`, `limit = n`),
    the demo tokenizer, the key from SPECGEN_BENCH_KEY, and the given TOML lines for
    [endpoint] (after base_url and api_key_env), [sampling] and [engine]."""
    def lines(text: str) -> str:
        return "".join(line.strip() + "\n" for line in text.strip().splitlines())

    path.write_text(f"""run_dir = "{run_dir}"
[target]
model = "{model}"
tokenizer = "demo"
[endpoint]
base_url = "{url}"
api_key_env = "SPECGEN_BENCH_KEY"
{lines(endpoint)}[sampling]
{lines(sampling)}[engine]
{lines(engine)}[[dataset]]
name = "bench"
path = "{data}"
limit = {n}
""")
    return path


# -- synthetic stores -----------------------------------------------------------------------
def synthetic_store_begin(run_dir: Path, datasets: dict[str, int]):
    """A new store with the meta of a finished Kimi-K2.5 run, one session and `datasets`
    (name -> rows read), in an open transaction: (store, its connection). Add the samples
    with `insert_samples`, then `COMMIT` and close."""
    if SRC not in sys.path:
        sys.path.insert(0, SRC)
    from specgen.store import Store

    store = Store.create(run_dir)
    c = store.conn
    c.execute("BEGIN")
    for k, v in {"config_hash": "bench", "renderer": "kimi-k2.5", "model": "bench/model",
                 "tokenizer_fingerprint": "bench", "thinking": "1", "shard": "",
                 "config_json": "{}"}.items():
        store.set_meta(k, v)
    c.execute("INSERT INTO sessions(id, started_at, state) VALUES(1, 0, 'finished')")
    for pos, (name, rows) in enumerate(datasets.items()):
        c.execute("INSERT INTO datasets(name, position, rows_read, exhausted, state) "
                  "VALUES(?, ?, ?, 1, 'done')", (name, pos, rows))
    return store, c


def insert_samples(c, conversations: list, tasks: list, results: list,
                   attempts: list | None = None) -> None:
    """Rows in the store's documented column order (docs/design.md, "Store schema")."""
    c.executemany("INSERT INTO conversations(id, dataset, conv_id, row_index, status, "
                  "end_reason, data) VALUES(?,?,?,?,?,?,?)", conversations)
    c.executemany("INSERT INTO tasks(id, conversation, dataset, turn, status, attempts) "
                  "VALUES(?,?,?,?,?,?)", tasks)
    c.executemany("INSERT INTO results(task, conversation, dataset, turn, provider, model, "
                  "finish_reason, native_finish_reason, request, message, input_ids, "
                  "n_prompt, prompt_tokens, completion_tokens, cost_usd, repairs, "
                  "created_at) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", results)
    if attempts:
        c.executemany("INSERT INTO attempts(task, session, provider, model, started_at, "
                      "first_byte_at, ended_at, outcome, prompt_tokens, completion_tokens, "
                      "cost_usd) VALUES(?,?,?,?,?,?,?,?,?,?,?)", attempts)


def timed_specgen(args: list[str]) -> tuple[float, float, str]:
    """One `python -m specgen ARGS` process of this checkout: (wall seconds, peak RSS MiB,
    its stdout); a failure stops the bench with the command's stderr."""
    t0 = time.perf_counter()
    status, usage, out, err = run_measured([sys.executable, "-m", "specgen", *args],
                                           child_env=env())
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"specgen {' '.join(args)} failed: {err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out
