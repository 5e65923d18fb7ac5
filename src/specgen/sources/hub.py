"""Datasets on the Hugging Face Hub: `path = "hf://datasets/OWNER/NAME"` (docs/datasets.md,
"From the Hub").

Read through `huggingface_hub`, so its cache (HF_HOME / HF_HUB_CACHE), HF_TOKEN, HF_ENDPOINT,
HF_HUB_OFFLINE and the proxy variables behave as its users expect. `plan_hub` resolves the
revision to a commit and picks the files the chosen subset and split need (the README's YAML
`configs:` data_files when present, else the standard layouts, else the repo's
`refs/convert/parquet` branch when it holds only a loading script); `download_plan` fetches
them into the cache, resumably (a partial blob survives a kill and is continued with a Range
request). Nothing here knows about runs: pinning a plan to a run is the engine's job
(specgen.engine.hub_pin).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .files import DATA_SUFFIXES, SourceError, _names_split

PREFIX = "hf://datasets/"
CONVERSION = "refs/convert/parquet"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SPLITS = ("train", "test", "validation", "valid", "dev", "eval")
_SHA = re.compile(r"^[0-9a-f]{40}$")


class HubError(SourceError):
    """A Hub dataset cannot be resolved or fetched (the message names what to do)."""


def hub_repo(path: str) -> str | None:
    """The repo id of an `hf://datasets/OWNER/NAME` path (None for any other path)."""
    if not path.startswith("hf://"):
        return None
    repo = path[len(PREFIX):].strip("/") if path.startswith(PREFIX) else ""
    if not _REPO.match(repo):
        raise HubError(f"{path!r}: a Hub dataset path is hf://datasets/OWNER/NAME (the "
                       "revision, subset and split are keys of the [[dataset]] table)")
    return repo


@dataclass
class HubFile:
    path: str  # inside the repo
    size: int | None = None


@dataclass
class HubPlan:
    """What a Hub dataset reads: the repo at a commit, and its files for a subset and split."""

    repo: str
    revision: str  # as configured
    commit: str  # what `revision` pointed at when the plan was made (the pin)
    subset: str | None
    split: str | None
    files: list[HubFile] = field(default_factory=list)
    data_revision: str | None = None  # the commit the files are read at (None: `commit`)
    layout: str = "data files"  # "yaml configs", "data files" or CONVERSION

    @property
    def read_at(self) -> str:
        return self.data_revision or self.commit

    @property
    def total_size(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HubPlan:
        d = dict(d)
        d["files"] = [HubFile(**f) for f in d.get("files", [])]
        return cls(**d)

    def describe(self) -> str:
        """hf://datasets/O/N subset S split T @ commit (one line, no secrets)."""
        parts = [f"{PREFIX}{self.repo}"]
        if self.subset:
            parts.append(f"subset {self.subset}")
        if self.split:
            parts.append(f"split {self.split}")
        at = f"commit {self.commit[:12]}"
        if self.revision != self.commit:
            at = f"revision {self.revision!r} = {at}"
        if self.data_revision:
            at += f" (read from its {CONVERSION} commit {self.data_revision[:12]})"
        return f"{' '.join(parts)}, {at}"


# -- resolving ----------------------------------------------------------------------------

def plan_hub(repo: str, revision: str | None, subset: str | None, split: str | None,
             name: str) -> HubPlan:
    """Resolve `revision` to a commit and choose the files (online; offline: from the cache)."""
    from huggingface_hub import constants

    revision = revision or "main"
    if constants.is_offline_mode():
        return _plan_offline(repo, revision, subset, split, name, "HF_HUB_OFFLINE is set")
    try:
        commit, files = _listing(repo, revision)
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001 - network trouble: the cache may hold the commit
        if not _is_network(exc):
            raise HubError(_hub_error(exc, repo, name, revision)) from None
        return _plan_offline(repo, revision, subset, split, name,
                             f"the Hub is unreachable ({type(exc).__name__})")
    _remember(repo, revision, commit)
    plan = _choose(repo, revision, commit, files, subset, split, name)
    if plan.data_revision:
        _remember(repo, CONVERSION, plan.data_revision)
    return plan


def _remember(repo: str, revision: str, commit: str) -> None:
    """refs/<revision> in the cache, as huggingface_hub writes it: an offline session finds
    the commit a branch or tag pointed at."""
    if _SHA.match(revision):
        return
    ref = _repo_cache(repo) / "refs" / revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    except OSError:
        pass  # a read-only cache: offline sessions then need the commit itself


def current_commit(repo: str, revision: str) -> str | None:
    """What `revision` points at upstream now (None when offline or unreachable)."""
    from huggingface_hub import constants

    if _SHA.match(revision) or constants.is_offline_mode():
        return None
    try:
        return _listing(repo, revision, files=False, timeout=10)[0]
    except Exception:  # noqa: BLE001 - only a note depends on it
        return None


def _listing(repo: str, revision: str, files: bool = True, timeout: float | None = None
             ) -> tuple[str, dict[str, int | None]]:
    from huggingface_hub import HfApi

    info = HfApi().dataset_info(repo, revision=revision, files_metadata=files, timeout=timeout)
    return info.sha, {s.rfilename: s.size for s in (info.siblings or [])}


def _choose(repo, revision, commit, files, subset, split, name) -> HubPlan:
    plan = HubPlan(repo, revision, commit, subset, split)
    configs = _yaml_configs(repo, commit, files)
    if configs:
        plan.layout = "yaml configs"
        chosen, plan.split = _from_configs(configs, files, subset, split, name, repo)
    else:
        data = [f for f in files if _is_data(f)]
        if not data and any(f.endswith(".py") for f in files):
            return _conversion(plan, name)
        chosen, plan.split = _standard(data, subset, split, name, repo)
    plan.files = [HubFile(f, files.get(f)) for f in chosen]
    return plan


def _conversion(plan: HubPlan, name: str) -> HubPlan:
    """The repo holds a loading script: read the Hub's Parquet conversion of it."""
    try:
        sha, files = _listing(plan.repo, CONVERSION)
    except Exception as exc:  # noqa: BLE001
        raise HubError(f"{_hub_error(exc, plan.repo, name, CONVERSION)} (the repo holds only "
                       f"a loading script, so its {CONVERSION} branch is read)") from None
    plan.layout, plan.data_revision = CONVERSION, sha
    subsets = sorted({f.split("/")[0] for f in files if f.endswith(".parquet") and "/" in f})
    subset = plan.subset or _only(subsets, "default", "subset", name, plan.repo)
    if subset not in subsets:
        raise HubError(f"dataset {name!r}: {PREFIX}{plan.repo} ({CONVERSION}) has no subset "
                       f"{subset!r}; it has: {', '.join(subsets) or 'none'}")
    mine = [f for f in files if f.startswith(subset + "/") and f.endswith(".parquet")]
    splits = sorted({_conversion_split(f, subset) for f in mine})
    split = plan.split or _only(splits, "train", "split", name, plan.repo)
    chosen = sorted(f for f in mine if _conversion_split(f, subset) == split)
    if not chosen:
        raise HubError(f"dataset {name!r}: {PREFIX}{plan.repo} subset {subset!r} has no split "
                       f"{split!r}; it has: {', '.join(splits)}")
    plan.subset, plan.split = subset, split
    plan.files = [HubFile(f, files.get(f)) for f in chosen]
    return plan


def _conversion_split(path: str, subset: str) -> str:
    # SUBSET/SPLIT/0000.parquet (current) or SUBSET/partial-SPLIT/..., SUBSET/SUBSET-SPLIT.parquet
    rest = path[len(subset) + 1:]
    if "/" in rest:
        return rest.split("/")[0].removeprefix("partial-")
    stem = rest.removesuffix(".parquet")
    return re.sub(r"-\d{5}-of-\d{5}$", "", stem).removeprefix(subset + "-")


def _yaml_configs(repo: str, commit: str, files: dict) -> list[dict[str, Any]]:
    if "README.md" not in files:
        return []
    from huggingface_hub import hf_hub_download
    from huggingface_hub.repocard import metadata_load

    local = _repo_cache(repo) / "snapshots" / commit / "README.md"
    if not local.is_file():
        local = Path(hf_hub_download(repo, "README.md", repo_type="dataset", revision=commit))
    meta = metadata_load(local) or {}
    configs = meta.get("configs")
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _from_configs(configs, files, subset, split, name, repo) -> tuple[list[str], str]:
    by_name = {str(c.get("config_name", "default")): c for c in configs}
    if subset is None:
        default = [n for n, c in by_name.items() if c.get("default")]
        subset = default[0] if default else _only(sorted(by_name), "default", "subset", name, repo)
    if subset not in by_name:
        raise HubError(f"dataset {name!r}: {PREFIX}{repo} has no subset {subset!r}; its README "
                       f"names: {', '.join(sorted(by_name))}")
    splits = _config_splits(by_name[subset].get("data_files"))
    if not splits:
        raise HubError(f"dataset {name!r}: {PREFIX}{repo} subset {subset!r} names no data_files")
    split = split or _only(sorted(splits), "train", "split", name, repo)
    if split not in splits:
        raise HubError(f"dataset {name!r}: {PREFIX}{repo} subset {subset!r} has no split "
                       f"{split!r}; it has: {', '.join(sorted(splits))}")
    chosen = sorted(f for f in files if any(_glob(p, f) for p in splits[split]))
    if not chosen:
        raise HubError(f"dataset {name!r}: {PREFIX}{repo} subset {subset!r} split {split!r}: "
                       f"no file matches {', '.join(splits[split])}")
    return chosen, split


def _config_splits(data_files: Any) -> dict[str, list[str]]:
    """A YAML config's data_files as {split: [patterns]} (a bare pattern list is `train`)."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {str(k): [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    out: dict[str, list[str]] = {}
    for item in data_files or []:
        if isinstance(item, str):
            out.setdefault("train", []).append(item)
        elif isinstance(item, dict) and "path" in item:
            paths = item["path"]
            out.setdefault(str(item.get("split", "train")), []).extend(
                [paths] if isinstance(paths, str) else paths)
    return out


def _glob(pattern: str, path: str) -> bool:
    """HF data_files patterns: `*` stays inside a folder, `**` crosses folders."""
    rx = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
    rx = rx.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    if re.fullmatch(rx, path) is not None:
        return True
    # a folder named without wildcards stands for every file below it
    return not any(c in pattern for c in "*?[") and path.startswith(pattern.rstrip("/") + "/")


def _standard(data, subset, split, name, repo) -> tuple[list[str], str | None]:
    if not data:
        raise HubError(f"dataset {name!r}: {PREFIX}{repo} holds no data files specgen reads "
                       f"({', '.join(DATA_SUFFIXES)})")
    if subset is not None:
        mine = [f for f in data if subset in f.split("/")[:-1]]
        if not mine:
            folders = sorted({p for f in data for p in f.split("/")[:-1]})
            raise HubError(f"dataset {name!r}: {PREFIX}{repo} has no subset folder {subset!r}; "
                           f"its folders: {', '.join(folders) or 'none'}")
        data = mine
    named = [f for f in data if any(_names_split(Path(f), s) for s in SPLITS)]
    if not named:  # no file names a split: all of them are `train` (as `datasets` reads it)
        if split not in (None, "train"):
            raise HubError(f"dataset {name!r}: {PREFIX}{repo}: no data file names split "
                           f"{split!r} (its files form one split, train)")
        return sorted(data), "train"
    if split is None:
        train = [f for f in data if _names_split(Path(f), "train")]
        return sorted(train or data), "train" if train else None
    chosen = [f for f in data if _names_split(Path(f), split)]
    if not chosen:
        raise HubError(f"dataset {name!r}: {PREFIX}{repo}: no data file names split {split!r}")
    return sorted(chosen), split


def _only(options: list[str], prefer: str, what: str, name: str, repo: str) -> str:
    if prefer in options:
        return prefer
    if len(options) == 1:
        return options[0]
    raise HubError(f"dataset {name!r}: {PREFIX}{repo} has several {what}s "
                   f"({', '.join(options)}); set `{what}` in the [[dataset]] table")


METADATA_FILES = ("dataset_info.json", "dataset_infos.json", "state.json",
                  "dataset_dict.json")


def _is_data(path: str) -> bool:
    low = path.lower()
    return (low.endswith(DATA_SUFFIXES) and low.rsplit("/", 1)[-1] not in METADATA_FILES
            and not any(p.startswith(".") for p in path.split("/")))


# -- offline ------------------------------------------------------------------------------

def _repo_cache(repo: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"datasets--{repo.replace('/', '--')}"


def _plan_offline(repo, revision, subset, split, name, why) -> HubPlan:
    """The commit the cache holds for `revision`, and the files cached under it."""
    cache = _repo_cache(repo)
    commit = revision if _SHA.match(revision) else None
    ref = cache / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    snap = cache / "snapshots" / (commit or "-")
    if commit is None or not snap.is_dir():
        raise HubError(f"dataset {name!r}: {why} and the Hub cache ({cache}) holds no commit "
                       f"of {PREFIX}{repo} revision {revision!r}; download it first (with the "
                       "network on: `specgen preview --download CONFIG`, or "
                       f"`hf download {repo} --repo-type dataset --revision {revision}`)")
    files = {str(p.relative_to(snap)): p.stat().st_size for p in snap.rglob("*") if p.is_file()}
    conv = cache / "refs" / CONVERSION
    if not any(_is_data(f) for f in files) and conv.is_file():
        plan = HubPlan(repo, revision, commit, subset, split)
        sha = conv.read_text().strip()
        csnap = cache / "snapshots" / sha
        cfiles = {str(p.relative_to(csnap)): p.stat().st_size
                  for p in csnap.rglob("*") if p.is_file()}
        plan.layout, plan.data_revision = CONVERSION, sha
        subsets = sorted({f.split("/")[0] for f in cfiles if "/" in f})
        sub = subset or _only(subsets, "default", "subset", name, repo)
        mine = [f for f in cfiles if f.startswith(sub + "/") and f.endswith(".parquet")]
        spl = split or _only(sorted({_conversion_split(f, sub) for f in mine}), "train",
                             "split", name, repo)
        plan.subset, plan.split = sub, spl
        plan.files = [HubFile(f, cfiles[f]) for f in sorted(mine)
                      if _conversion_split(f, sub) == spl]
        return plan
    return _choose(repo, revision, commit, files, subset, split, name)


def cached_files(repo: str, revision: str | None, subset: str | None, split: str | None,
                 name: str) -> list[Path] | None:
    """The files a Hub dataset reads when the cache holds all of them (no network), else None."""
    try:
        plan = _plan_offline(repo, revision or "main", subset, split, name, "cache only")
    except HubError:
        return None
    if missing_files(plan):
        return None
    return [p for f in plan.files if (p := cached_path(plan, f)) is not None]


# -- downloading --------------------------------------------------------------------------

def cached_path(plan: HubPlan, file: HubFile) -> Path | None:
    p = _repo_cache(plan.repo) / "snapshots" / plan.read_at / file.path
    return p if p.exists() else None


def missing_files(plan: HubPlan) -> list[HubFile]:
    return [f for f in plan.files if cached_path(plan, f) is None]


def download_plan(plan: HubPlan, name: str) -> list[Path]:
    """The plan's files in the local cache, fetching what is missing (resumably)."""
    from huggingface_hub import constants

    missing = missing_files(plan)
    if missing and constants.is_offline_mode():
        raise HubError(
            f"dataset {name!r}: HF_HUB_OFFLINE is set and {len(missing)} file(s) of "
            f"{plan.describe()} are not in the cache: {', '.join(f.path for f in missing)}; "
            "download them with the network on (`specgen preview --download CONFIG`)")
    for f in missing:
        try:
            _fetch(plan.repo, f.path, plan.read_at)
        except HubError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise HubError(f"{_hub_error(exc, plan.repo, name, plan.read_at)} (downloading "
                           f"{f.path} of {plan.describe()})") from None
    return [cached_path(plan, f) or _never(f) for f in plan.files]


def _never(f: HubFile) -> Path:
    raise HubError(f"{f.path}: downloaded but not found in the cache")


def _fetch(repo: str, filename: str, commit: str) -> None:
    """One file into the cache at `commit`: the blob is written to `<etag>.incomplete` and
    continued from its size after an interruption (huggingface_hub's own temp files are
    per process, so a killed download would start over)."""
    from filelock import FileLock
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, filename, repo_type="dataset", revision=commit)
    meta = get_hf_file_metadata(url)
    if meta.etag is None:
        raise HubError(f"{url}: the server sent no ETag for the file")
    blobs = _repo_cache(repo) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    blob = blobs / meta.etag
    if not blob.exists():
        part = blobs / f"{meta.etag}.incomplete"
        with FileLock(str(part) + ".lock"):
            if not blob.exists():
                headers = build_hf_headers()
                if _host(meta.location) != _host(url):
                    headers.pop("authorization", None)  # never send the token to a CDN
                _download(meta.location, part, headers, meta.size, filename)
                got = part.stat().st_size
                if meta.size is not None and got != meta.size:
                    raise HubError(f"{filename}: {got:,} bytes arrived, the Hub announced "
                                   f"{meta.size:,}; run again to continue the download")
                os.replace(part, blob)
    # huggingface_hub links the finished blob into snapshots/<commit>/ itself
    hf_hub_download(repo, filename, repo_type="dataset", revision=commit)


def _download(url: str, part: Path, headers: dict, size: int | None, label: str) -> None:
    """Append `url`'s bytes to `part` from its current size on (a Range request), with a
    progress bar (huggingface_hub's; HF_HUB_DISABLE_PROGRESS_BARS turns it off)."""
    from huggingface_hub.utils import get_session, hf_raise_for_status
    from huggingface_hub.utils import tqdm as hf_tqdm

    have = part.stat().st_size if part.exists() else 0
    if size is not None and have >= size:
        if have > size:
            part.unlink()
            have = 0
        else:
            return
    if have:
        headers = {**headers, "Range": f"bytes={have}-"}
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                              timeout=60) as resp:
        hf_raise_for_status(resp)
        mode = "ab" if have and resp.status_code == 206 else "wb"  # 200: the server restarts
        start = have if mode == "ab" else 0
        with open(part, mode) as out, hf_tqdm(total=size, initial=start, unit="B",
                                              unit_scale=True, desc=label) as bar:
            for chunk in resp.iter_bytes():
                out.write(chunk)
                out.flush()  # a kill loses nothing already received
                bar.update(len(chunk))


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).netloc


# -- errors -------------------------------------------------------------------------------

def _is_network(exc: BaseException) -> bool:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return True
    if isinstance(exc, HfHubHTTPError):
        return False
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - older huggingface_hub
        import httpx
    return isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError)


def _hub_error(exc: BaseException, repo: str, name: str, revision: str) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{constants.ENDPOINT}/datasets/{repo}"
    token = "HF_TOKEN is set" if _has_token() else "no token is set (HF_TOKEN or `hf auth login`)"
    if isinstance(exc, GatedRepoError):
        return (f"dataset {name!r}: {PREFIX}{repo} is gated: accept its conditions at {page} "
                f"and use a token of that account; {token}")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"dataset {name!r}: {PREFIX}{repo} was not found, or it is private or gated "
                f"and the request was not authorised; {token}")
    if isinstance(exc, RevisionNotFoundError):
        return f"dataset {name!r}: {PREFIX}{repo} has no revision {revision!r}"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"dataset {name!r}: {PREFIX}{repo}: {first}"


def _has_token() -> bool:
    from huggingface_hub import get_token

    try:
        return bool(get_token())
    except Exception:  # noqa: BLE001
        return False
