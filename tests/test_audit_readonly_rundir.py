"""A run dir this user cannot write (third reliability audit): `report` and `provider
--exclude/--allow` say so and exit 2, not a traceback; the readers that only read still work,
and the run dir is left as it was — real `specgen` processes on a real run dir.

Permission bits do not stop root, so as root the run dir is made read-only for the command
alone: in a private mount namespace (`unshare -m`) the run dir is bind-mounted read-only over
itself. Dropping to an unprivileged user would be the other way, but this interpreter may sit
under a directory only root can enter; the test tries that first and says which it used."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from test_engine_support import ENV, SPECGEN, prompt_rows, run_cli, write_config, write_jsonl

NOBODY = 65534


def _demote() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _as_nobody_works() -> bool:
    try:
        r = subprocess.run([*SPECGEN, "--help"], capture_output=True, timeout=60, env=ENV,
                           preexec_fn=_demote, cwd="/")
    except OSError:
        return False
    return r.returncode == 0


def _mount_works(where) -> str | None:
    """None if a read-only bind mount in a private namespace works here, else why not."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "no unshare/mount command"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        f'mount --bind "{where}" "{where}" && '
                        f'mount -o remount,bind,ro "{where}" && ! touch "{where}/.w"'],
                       capture_output=True, text=True, timeout=60)
    return None if r.returncode == 0 else f"read-only bind mount refused: {r.stderr.strip()}"


@pytest.fixture
def readonly(tmp_path):
    """A finished run's dir, and a runner of `specgen ...` for which it is read-only."""
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}],
                        sampling="max_tokens = 256")
    res = run_cli(path)
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = tmp_path / "run-dir"
    (tmp_path / "out").mkdir()
    if os.geteuid() != 0:
        for p in [run_dir, *run_dir.iterdir()]:
            p.chmod(p.stat().st_mode & ~0o222)

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*SPECGEN, *args], capture_output=True, text=True,
                                  timeout=120, env=ENV)
        try:
            yield run_dir, cli
        finally:
            for p in [run_dir, *run_dir.iterdir()]:
                p.chmod(p.stat().st_mode | 0o200)
        return
    if _as_nobody_works():
        os.chmod(tmp_path, 0o755)
        for p in (tmp_path.parent, tmp_path.parent.parent):
            os.chmod(p, os.stat(p).st_mode | 0o005)
        subprocess.run(["chmod", "-R", "a+rX", str(run_dir)], check=True)
        os.chown(tmp_path / "out", NOBODY, NOBODY)

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*SPECGEN, *args], capture_output=True, text=True,
                                  timeout=120, env={**ENV, "HOME": str(tmp_path / "out")},
                                  preexec_fn=_demote, cwd="/")
        yield run_dir, cli
        return
    why = _mount_works(run_dir)
    if why is not None:
        pytest.skip(f"as root chmod does not stop writes, no unprivileged user can run this "
                    f"interpreter, and {why}")

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = " ".join(f"'{a}'" for a in [*SPECGEN, *args])
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               f'mount --bind "{run_dir}" "{run_dir}" && '
                               f'mount -o remount,bind,ro "{run_dir}" && exec {cmd}'],
                              capture_output=True, text=True, timeout=120, env=ENV)
    yield run_dir, cli


def _listing(run_dir) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}


def test_report_and_provider_on_a_read_only_run_dir_say_so(readonly, tmp_path):
    run_dir, cli = readonly
    before = _listing(run_dir)
    res = cli("report", str(run_dir))
    assert res.returncode == 2, (res.stdout, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    assert f"cannot write {run_dir / 'report.html'}" in res.stderr
    assert "-o PATH writes it elsewhere" in res.stderr
    for action in ("--exclude", "--allow"):
        res = cli("provider", str(run_dir), action, "Together")
        assert res.returncode == 2, (action, res.stdout, res.stderr[-2000:])
        assert "Traceback" not in res.stderr
        assert f"the run dir {run_dir} is not writable here" in res.stderr, res.stderr
    # what only reads still works, and a report written elsewhere too
    assert cli("status", str(run_dir)).returncode == 0
    assert cli("report", str(run_dir), "--text").returncode == 0
    other = tmp_path / "out" / "r.html"
    res = cli("report", str(run_dir), "-o", str(other))
    assert res.returncode == 0, res.stderr[-2000:]
    assert other.read_text().startswith("<!")
    assert _listing(run_dir) == before  # nothing written, nothing left behind
