"""Credentials in any part of a base URL are refused before anything is stored (third
reliability audit): a key as a path segment, a `;key=` path parameter, a `?credential=` query —
`specgen run` exits 2 naming the fix, the secret never echoed, no run dir written."""

from __future__ import annotations

import subprocess

import pytest

from specgen.config import redact_url
from test_engine_support import ENV, SPECGEN, config_text

SECRET = "sk-or-v1-" + "5f" * 32
FORMS = [
    f"https://openrouter.ai/{SECRET}/v1",
    f"https://openrouter.ai/api/v1;key={SECRET}",
    f"https://openrouter.ai/api/v1?credential={SECRET}",
    f"https://openrouter.ai/api/v1?a=1;token={SECRET}",
    "https://openrouter.ai/api/Zx81Qw27Lm93Kd45Pr62Ty10Uv38Ns56/v1",
]


@pytest.mark.parametrize("url", FORMS)
def test_a_secret_anywhere_in_the_base_url_is_refused(tmp_path, url):
    cfg = tmp_path / "run.toml"
    cfg.write_text(config_text(tmp_path / "run-dir", url, [{"name": "a", "path": "a.jsonl"}]))
    (tmp_path / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    res = subprocess.run([*SPECGEN, "run", str(cfg), "--no-live"], capture_output=True,
                         text=True, timeout=60, env=ENV)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "carries credentials" in out and "***" in out
    assert "Traceback" not in out
    assert SECRET[9:25] not in out and "Zx81Qw27Lm93" not in out
    assert not (tmp_path / "run-dir" / "state.sqlite").exists()


@pytest.mark.parametrize("url", [
    "https://openrouter.ai/api/v1", "http://127.0.0.1:8000/v1", "https://api.together.xyz/v1",
    "https://x--serve.modal.run/v1", "https://h/openai/deployments/gpt-4o-mini-2024-07-18/v1",
    "http://10.0.0.5:30000/v1;version=2",
])
def test_ordinary_base_urls_pass(url):
    assert redact_url(url) == (url, False)
