"""SkyPilot's task files through ec2gpu's loader: which run as SkyPilot runs them, which with a warning,
which are refused, and which crash it (issue 28: the tally and the rules in docs/skypilot.md).

    .venv/bin/python scripts/skypilot_tally.py SKYPILOT_CHECKOUT [--extra DIR]... [--write docs/skypilot.md] [--json]
    .venv/bin/python scripts/skypilot_tally.py --git-dir SKYPILOT.git [--ref HEAD] ...

Each task file under ``examples/`` and ``llm/`` (and every task file under each ``--extra`` DIR) is
given to ``ec2gpu.tasks.load.parse`` exactly as ``ec2gpu run FILE`` gives it: its own text, relative
paths starting at its own directory. Outcomes:

- ``clean``: loaded, no warning (runs as SkyPilot runs it, unless a check below says otherwise);
- ``warned``: loaded with warnings, each naming a difference;
- ``refused``: UsageError, one line (the message and its hint are recorded);
- ``crash``: any other exception: a bug in ec2gpu to report (type, message and where it was raised).

Which YAML files are task files (TASK_KEYS, NOT_TASK_KEYS): a document is a SkyPilot task when it is
a mapping with at least one of run, setup, resources, num_nodes, file_mounts at its top level and it
is not a Kubernetes manifest (apiVersion + kind), a docker-compose file (services), a GitHub workflow
(jobs) or action (runs). A file is a task file when one of its documents is (so pipelines and job
groups, several documents, are included). Text that is not YAML is included when a line starts with
one of TASK_KEYS and a colon. Everything else (SkyPilot configs, admin policies, Helm values,
trainer configs, ...) is skipped and counted.

``--git-dir`` writes the tree at REF into a temporary directory first (``git ls-tree`` and ``git
cat-file``; a blob the mirror lacks becomes an empty file, counted), so that a workdir or a local
file_mounts source that exists in SkyPilot's repository exists here too: the tally shows what ec2gpu
makes of a file's meaning, not of a missing directory. SkyPilot reads a relative workdir from the
directory ``sky`` is called in; ec2gpu from the task file's directory. Where ec2gpu refuses a
workdir that exists relative to the repository root (where SkyPilot's docs run those files), the
note column says so.

Checks for differences nobody is told about (``silent (KIND)`` in the notes, best effort): a GPU
count the chosen instance type exceeds (catalog); no GPU asked, where SkyPilot picks a CPU instance
and ec2gpu its default type; accelerators inside a dropped any_of/ordered; an ``envs`` value YAML
types as a boolean or number that ec2gpu spells differently from SkyPilot's ``str(value)``; no
``workdir`` in the file while ec2gpu syncs one (SkyPilot syncs nothing then); an ``instance_type``
that is not an EC2 type name. Refusals get ``misleading?`` notes (MISLEADING).

No AWS credentials or network are used: every AWS_* and EC2GPU_* variable is removed from the
environment first and the AWS config and credentials files point at /dev/null.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the ec2gpu of this checkout, installed or not

FOLDERS = ("examples", "llm")  # SkyPilot's folders of task files
SUFFIXES = (".yaml", ".yml")
TASK_KEYS = ("run", "setup", "resources", "num_nodes", "file_mounts")
NOT_TASK_KEYS = (("apiVersion", "kind"), ("services",), ("jobs",), ("runs",))  # k8s, compose, workflow, action
OUTCOMES = {"clean": "runs as SkyPilot runs it", "warned": "runs with a warning naming each difference",
            "refused": "refused with one line", "crash": "crash (a bug to report)"}
EXTRA = "extra/"  # the label of a file from an --extra folder starts so
MARK = "<!-- skypilot_tally:{}:{} -->"  # section name, start/end
TEXT_WIDTH = 180  # characters of a warning or refusal shown in the table


@dataclass
class Result:
    """One task file through ec2gpu's loader. ``seconds``: wall time of parse (perf_counter)."""

    file: str
    outcome: str
    text: str = ""  # the warnings ("; "-joined), the refusal's message, or the crash's "Type: message"
    hint: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # normalised, for grouping (reason_keys)
    where: str = ""  # a crash: file:line of the innermost frame


# -- finding task files -------------------------------------------------------------------------

def task_document(doc) -> bool:
    """True when the YAML document ``doc`` is a SkyPilot task (module docstring's rule) (pure)."""
    if not isinstance(doc, dict):
        return False
    keys = {str(k) for k in doc}
    return bool(keys & set(TASK_KEYS)) and not any(set(m) <= keys for m in NOT_TASK_KEYS)


def is_task_file(text: str) -> bool:
    """True when one document of ``text`` is a task, or ``text`` is not YAML and a line starts with
    one of TASK_KEYS and a colon (pure)."""
    try:
        return any(task_document(d) for d in yaml.safe_load_all(text))
    except (yaml.YAMLError, RecursionError, ValueError):
        return bool(re.search(rf"^({'|'.join(TASK_KEYS)})\s*:", text, re.M))


def yaml_files(root: Path, folders=FOLDERS) -> list[Path]:
    """The .yaml/.yml files under ``root``/FOLDER for each of ``folders`` (all of ``root`` when
    ``folders`` is empty), sorted, links to directories not followed."""
    tops = [root / f for f in folders] if folders else [root]
    return sorted(p for top in tops if top.is_dir() for p in top.rglob("*")
                  if p.suffix in SUFFIXES and p.is_file())


def materialize(git_dir: Path, ref: str, dest: Path) -> int:
    """Write the tree of ``ref`` in the bare repository ``git_dir`` under ``dest`` (links as links,
    submodules as empty directories). Returns how many blobs the repository lacks (written empty: a
    mirror leaves out its largest files). Raises CalledProcessError for an unknown ref."""
    git = ["git", f"--git-dir={git_dir}"]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", "--full-tree", ref], capture_output=True,
                             check=True).stdout.split(b"\0")
    entries = []
    for line in filter(None, listing):
        meta, path = line.split(b"\t", 1)
        mode, kind, sha = meta.decode().split()
        entries.append((mode, kind, sha, dest / os.fsdecode(path)))
    blobs = [e for e in entries if e[1] == "blob"]
    cat = subprocess.run([*git, "cat-file", "--batch"], input="".join(f"{e[2]}\n" for e in blobs).encode(),
                         capture_output=True, check=True).stdout
    missing, at = 0, 0
    for mode, _kind, _sha, path in blobs:
        end = cat.index(b"\n", at)
        header, at = cat[at:end].split(), end + 1
        body = b""
        if header[-1] == b"missing":
            missing += 1
        else:
            size = int(header[2])
            body, at = cat[at:at + size], at + size + 1
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(os.fsdecode(body), path)
        else:
            path.write_bytes(body)
    for _mode, kind, _sha, path in entries:
        if kind == "commit":
            path.mkdir(parents=True, exist_ok=True)
    return missing


# -- one file through the loader ----------------------------------------------------------------

def classify(text: str, label: str, base: Path, repo_root: Path | None = None,
             hide: Path | None = None) -> Result:
    """``text`` (a task file shown as ``label``, relative paths from ``base``) through
    ``ec2gpu.tasks.load.parse``: its outcome, its text (``hide``/ left out of paths in it), the time
    parse took, and notes (silent differences; a refused workdir that exists from ``repo_root``;
    a refusal that may mislead). Never raises for the file's sake."""
    from ec2gpu.errors import UsageError
    from ec2gpu.tasks import load as loader

    t0, warnings = time.perf_counter(), None
    try:
        loaded = loader.parse(text, label, base)
    except UsageError as exc:
        r = Result(label, "refused", exc.message, exc.hint, time.perf_counter() - t0)
        r.notes += refusal_notes(exc.message, text, repo_root)
    except Exception as exc:  # a crash is the finding: keep it, never hide it
        r = Result(label, "crash", f"{type(exc).__name__}: {exc}", "", time.perf_counter() - t0,
                   where=_raised_at(exc))
    else:
        warnings = list(loaded.warnings)
        r = Result(label, "warned" if warnings else "clean", "; ".join(warnings), "", time.perf_counter() - t0)
        r.notes += silent_differences(loaded, text)
    prefix = f"{hide or repo_root}{os.sep}" if (hide or repo_root) else None
    if prefix:  # paths in messages relative to the repository, not to this run's temporary directory
        r.text, r.hint = r.text.replace(prefix, ""), r.hint.replace(prefix, "")
        warnings = warnings and [w.replace(prefix, "") for w in warnings]
    r.reasons = reason_keys(r, label, warnings)
    return r


def _raised_at(exc: BaseException) -> str:
    """"file.py:LINE" of the innermost frame of ``exc`` inside the ec2gpu package (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}ec2gpu{os.sep}" in f.filename] or frames
    return f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"


def _raw(text: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_EC2_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")  # family.size: g5.xlarge, u-6tb1.metal


def silent_differences(loaded, text: str) -> list[str]:
    """What a loaded task does differently from SkyPilot without a warning saying so (module
    docstring's checks), as "silent (KIND): ..." notes; a check that cannot run says why instead."""
    raw, task, notes = _raw(text), loaded.task, []
    res = raw.get("resources") if isinstance(raw.get("resources"), dict) else {}
    envs = raw.get("envs") if isinstance(raw.get("envs"), dict) else {}
    for k, v in envs.items():
        if v is not None and not isinstance(v, str) and task.envs.get(str(k)) != str(v):
            notes.append(f"silent (envs): envs.{k} is {task.envs.get(str(k))!r}, SkyPilot sets {str(v)!r}")
    if "workdir" not in raw and loaded.workdir is not None and not any("no workdir:" in w for w in loaded.warnings):
        notes.append("silent (default workdir): no workdir in the file, yet its directory is synced "
                     "(SkyPilot syncs nothing)")
    from ec2gpu.aws import catalog
    from ec2gpu.tasks import resolve
    notes += [f"silent (instance type): {t!r} is not an EC2 instance type name"
              for t in task.resources.instance_types if not _EC2_TYPE.match(t)]
    try:
        choices = resolve.plan(task.resources).choices
    except Exception as exc:  # the loader accepted what resolve refuses: a finding, never a crash of the tally
        return notes + [f"silent (refused at launch): {type(exc).__name__}: {getattr(exc, 'message', exc)}"]
    if all(c.instance_type is None for c in choices) and not any("where SkyPilot would choose a CPU instance"
                                                                   in w for w in loaded.warnings):
        from ec2gpu import settings
        default = getattr(settings, "DEFAULT_INSTANCE_TYPE", "its default")
        asked = "accelerators" in str([res.get("any_of"), res.get("ordered")])
        notes.append(f"silent (GPU dropped): the accelerators in any_of/ordered are dropped; {default} is used"
                     if asked else f"silent (no GPU asked): SkyPilot picks a CPU instance; ec2gpu {default}")
    for c in choices:
        have = catalog.CATALOG.get(c.instance_type or "")
        if have and c.gpus_asked and not c.larger and have.gpu_count != c.gpus_asked:
            notes.append(f"silent (GPU count): {c.asked} asked, {c.instance_type} has {have.gpu_count} GPUs")
    return notes


def refusal_notes(message: str, text: str, repo_root: Path | None) -> list[str]:
    """Notes on a refusal: a workdir that exists from ``repo_root``; messages that look misleading."""
    raw, notes = _raw(text), []
    wd = raw.get("workdir")
    if "workdir" in message and isinstance(wd, str) and repo_root is not None:
        where = "exists" if (repo_root / wd).is_dir() else "does not exist either"
        notes.append(f"from the repository root (SkyPilot reads workdir from the launch directory) {wd!r} {where}")
    for pattern, why in MISLEADING:
        if re.search(pattern, message):
            notes.append(f"misleading? {why}")
    return notes


#: refusal messages that may mislead a SkyPilot user: (regex on the message, why)
MISLEADING = (
    (r"Input should be a valid|valid dictionary|valid list", "pydantic's wording, not what to write"),
    (r":None' is not a GPU", "a {GPU:N} map read as a name"),
    (r"single document|another document", "several YAML documents (a pipeline or job group) called not valid YAML"),
    (r"workdir: .*~", "'~' taken as a directory name"),
    (r"'(?!tpu)[A-Za-z0-9]+-[^':]*(:\d+)?' is not a GPU", "a GPU name SkyPilot knows (with '-') called not a GPU"),
    (r":0\.\d+' is not a GPU", "a fractional GPU count called not a GPU"),
    (r": unknown field", "a field SkyPilot reads (an alias or legacy name) called unknown; "
                         "the hint names only ec2gpu's"),
)


# -- grouping -----------------------------------------------------------------------------------

_VALUES = re.compile(r"'[^']*'|\S*/\S*")  # quoted values and paths: left out of a reason's key


def reason_keys(result: Result, label: str, warnings: list[str] | None) -> list[str]:
    """One key per reason in ``result`` (pure): a warning listing fields ("...: a, b") gives one key
    per field; a refusal or crash gives its message without the "FILE:LINE: " prefix, quoted values
    and paths shown as '…' (reason_values gives them back)."""
    if result.outcome == "clean":
        return []
    if result.outcome == "crash":
        return [f"{result.text.split(':')[0]} at {result.where}"]
    keys = []
    for t in warnings if warnings is not None else [result.text]:
        t = re.sub(rf"^{re.escape(label)}:\d+: ", "", t)
        head, _, tail = t.rpartition(": ")
        items = [i.strip() for i in tail.split(",")]
        if result.outcome == "warned" and head and all(re.fullmatch(r"[\w.\-]+", i) for i in items):
            keys += [f"{head}: {i}" for i in items]
        else:
            keys.append(_VALUES.sub("…", t))
    return keys


def reason_values(result: Result) -> list[str]:
    """The quoted values and paths reason_keys left out of a refusal's key (pure)."""
    if result.outcome != "refused":
        return []
    return _VALUES.findall(re.sub(rf"^{re.escape(result.file)}:\d+: ", "", result.text))


def silent_kind(note: str) -> str | None:
    """"GPU count" for a note "silent (GPU count): ...", None for another note (pure)."""
    m = re.match(r"silent \(([^)]*)\)", note)
    return m.group(1) if m else None


def tally(results: list[Result]) -> dict:
    """Counts by outcome, reasons grouped by outcome (count, and for a refusal the values in it),
    silent differences by kind, parse time max/median (ms) (pure)."""
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    reasons: dict[str, dict[str, int]] = {o: {} for o in OUTCOMES}
    values: dict[str, dict[str, int]] = {}
    silent: dict[str, int] = {}
    for r in results:
        for k in r.reasons:
            reasons[r.outcome][k] = reasons[r.outcome].get(k, 0) + 1
        if r.outcome == "refused" and r.reasons:
            for v in reason_values(r):
                values.setdefault(r.reasons[0], {}).setdefault(v, 0)
                values[r.reasons[0]][v] += 1
        for kind in {silent_kind(n) for n in r.notes} - {None}:
            silent[kind] = silent.get(kind, 0) + 1
    ms = [r.seconds * 1000 for r in results] or [0.0]
    by_count = lambda d: dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return {"files": len(results), "counts": counts,
            "silent_files": sum(any(silent_kind(n) for n in r.notes) for r in results),
            "silent_by_kind": by_count(silent),
            "misleading_files": sum(any(n.startswith("misleading?") for n in r.notes) for r in results),
            "reasons": {o: by_count(v) for o, v in reasons.items()},
            "reason_values": {k: by_count(v) for k, v in values.items()},
            "parse_ms": {"max": round(max(ms), 2), "median": round(statistics.median(ms), 2)}}


# -- the rules, read from the loader ------------------------------------------------------------

def field_uses(texts: list[str]) -> dict[str, int]:
    """{field path: files using it} over the task documents of ``texts`` (top level and resources.*)."""
    uses: dict[str, int] = {}
    for text in texts:
        seen = set()
        try:
            docs = [d for d in yaml.safe_load_all(text) if task_document(d)]
        except (yaml.YAMLError, RecursionError, ValueError):
            docs = []
        for d in docs:
            seen |= {str(k) for k in d}
            if isinstance(d.get("resources"), dict):
                seen |= {f"resources.{k}" for k in d["resources"]}
        for k in seen:
            uses[k] = uses.get(k, 0) + 1
    return dict(sorted(uses.items(), key=lambda kv: (-kv[1], kv[0])))


def treatment(path: str) -> str:
    """How ec2gpu's loader treats the SkyPilot field ``path`` ("resources.cpus"), from its SKYPILOT_*
    sets (tasks/skypilot.py) and its Task model as they are now: read, renamed, warned and ignored, or
    unknown (refused)."""
    from ec2gpu.tasks import skypilot
    from ec2gpu.tasks.spec import Resources, Task
    parts = tuple(path.split("."))
    renames = skypilot.SKYPILOT_RENAMES
    aliases = skypilot.SKYPILOT_ALIASES
    if len(parts) == 2 and parts[0] == "resources" and parts[1] in aliases:
        parts = ("resources", aliases[parts[1]])
        return f"read (SkyPilot's other name for {'.'.join(parts)})"
    if parts == ("resources", "accelerators"):  # skypilot._skypilot_resources
        return "read (as ec2gpu's resources.gpu; a set as resources.any_of, a list as resources.ordered)"
    if parts in renames:
        return f"read (as ec2gpu's {'.'.join(renames[parts])})"
    warned = [v for k, v in vars(skypilot).items() if k.startswith("SKYPILOT_UNSUPPORTED")
              and ("RESOURCES" in k) == (len(parts) == 2)]
    if any(parts[-1] in s for s in warned):
        return "warned, ignored"
    model = Task if len(parts) == 1 else Resources
    return "read (ec2gpu's field of that name)" if parts[-1] in model.model_fields else "refused (unknown field)"


def rules_markdown(uses: dict[str, int]) -> str:
    from ec2gpu.tasks import skypilot
    sets = {k: v for k, v in vars(skypilot).items() if k.startswith("SKYPILOT_")}
    lines = ["How ec2gpu's loader treats each SkyPilot field these files use, read from "
             "`ec2gpu/tasks/skypilot.py` (its `SKYPILOT_*` tables) and `ec2gpu/tasks/spec.py` (the task model) "
             "when this section was generated:", "",
             "| field | files using it | ec2gpu |", "|---|---:|---|"]
    lines += [f"| `{k}` | {n} | {treatment(k)} |" for k, n in uses.items()]
    lines += ["", "A SkyPilot field in none of the loader's tables and not a field of ec2gpu's task model is "
              "refused as an unknown field. The loader's tables as they stand:", ""]
    for name, value in sorted(sets.items()):
        shown = (", ".join(f"`{a if isinstance(a, str) else '.'.join(a)}` → `{b if isinstance(b, str) else '.'.join(b)}`"
                           for a, b in value.items())
                 if isinstance(value, dict) else ", ".join(f"`{v}`" for v in sorted(value)))
        lines.append(f"- `{name}`: {shown}")
    return "\n".join(lines)


# -- output -------------------------------------------------------------------------------------

def _cell(s: str, width: int = TEXT_WIDTH) -> str:
    s = " ".join(s.split()).replace("|", "\\|")
    return s if len(s) <= width else s[:width - 1] + "…"


def tally_markdown(results: list[Result], summary: dict, source: str) -> str:
    c, ms = summary["counts"], summary["parse_ms"]
    lines = [f"Source: {source}. {summary['files']} task files; `parse` took at most {ms['max']} ms "
             f"(median {ms['median']} ms).", ""]
    extra = [r for r in results if r.file.startswith(EXTRA)]
    if extra:  # SkyPilot's own files and other projects' counted apart too
        ours = tally([r for r in results if not r.file.startswith(EXTRA)])["counts"]
        theirs = tally(extra)["counts"]
        lines += ["| outcome | SkyPilot's files | other projects' | all |", "|---|---:|---:|---:|"]
        lines += [f"| {OUTCOMES[o]} | {ours[o]} | {theirs[o]} | {c[o]} |" for o in OUTCOMES]
    else:
        lines += ["| outcome | files |", "|---|---:|"] + [f"| {OUTCOMES[o]} | {c[o]} |" for o in OUTCOMES]
    lines += ["", f"Loaded, with a difference no warning names: {summary['silent_files']} files ("
              + (", ".join(f"{k}: {n}" for k, n in summary["silent_by_kind"].items()) or "none") + "). "
              f"Refused with a message that may mislead: {summary['misleading_files']} files.",
              "", "Reasons, most common first (a warning naming several fields counts once per field):", ""]
    for o in ("warned", "refused", "crash"):
        for k, n in summary["reasons"][o].items():
            vals = summary["reason_values"].get(k, {})
            shown = ", ".join(f"{v} ({m})" if m > 1 else v for v, m in list(vals.items())[:8])
            more = f" and {len(vals) - 8} more" if len(vals) > 8 else ""
            lines.append(f"- {o}, {n}×: {_cell(k, 200)}" + (f" — {_cell(shown, 300)}{more}" if shown else ""))
    lines += ["", "| file | outcome | warning / refusal (hint) | notes | parse ms |", "|---|---|---|---|---:|"]
    for r in results:
        text = re.sub(rf"^{re.escape(r.file)}:(\d+): ", r"line \1: ", r.text)  # the file is in the first column
        text += (f" ({r.hint})" if r.hint else "") + (f" [at {r.where}]" if r.where else "")
        lines.append(f"| `{r.file}` | {r.outcome} | {_cell(text)} | {_cell('; '.join(r.notes), 240)} "
                     f"| {r.seconds * 1000:.1f} |")
    return "\n".join(lines)


def replace_section(doc: str, name: str, body: str) -> str:
    """``doc`` with the text between MARK(name, start) and MARK(name, end) replaced by ``body``.
    Raises ValueError when a marker is missing."""
    start, end = MARK.format(name, "start"), MARK.format(name, "end")
    if start not in doc or end not in doc:
        raise ValueError(f"{start} ... {end} not found: add both markers where the section goes")
    head, rest = doc.split(start, 1)
    return f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"


# -- main ---------------------------------------------------------------------------------------

def no_aws_environment() -> None:
    """Remove AWS_* and EC2GPU_* variables; AWS config and credentials files: /dev/null."""
    for k in [k for k in os.environ if k.startswith(("AWS_", "EC2GPU_"))]:
        del os.environ[k]
    os.environ.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                      AWS_EC2_METADATA_DISABLED="true")


def run_files(files: list[tuple[Path, str, Path | None, Path]]) -> tuple[list[Result], list[str]]:
    """(results, texts) for the task files among ``files``: (path, label, SkyPilot's repository
    root or None, the directory to leave out of paths in messages) tuples."""
    results, texts = [], []
    for path, label, repo_root, hide in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if is_task_file(text):
            results.append(classify(text, label, path.resolve().parent, repo_root, hide))
            texts.append(text)
    return results, texts


def _describe(args, root: Path) -> str:
    git = ["git", f"--git-dir={args.git_dir}"] if args.git_dir else ["git", "-C", str(root)]
    ref = args.ref if args.git_dir else "HEAD"
    done = subprocess.run([*git, "log", "-1", "--format=%H %cs", ref], capture_output=True, text=True)
    commit = done.stdout.split() if done.returncode == 0 else []
    what = f"SkyPilot's `{'`, `'.join(f + '/' for f in FOLDERS)}`"
    at = f" at commit {commit[0][:12]} ({commit[1]})" if commit else ""
    ours = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "ec2gpu"],
                           capture_output=True, text=True).stdout.strip()
    extra = f" and {len(args.extra)} --extra folder(s)" if args.extra else ""
    return (f"{what}{at}{extra}, read by ec2gpu {ours.stdout.strip() or '?'}"
            f"{' with uncommitted changes to ec2gpu/' if dirty else ''}")


def _warm_up(base: Path) -> None:
    """Import the loader and what it imports lazily (resolve, catalog), so no file's time includes it."""
    from ec2gpu.tasks import load as loader
    try:
        loader.parse("run: 'true'\nresources: {accelerators: T4:1}\n", "<warm-up>", base)
    except Exception:  # noqa: BLE001 - only the imports matter here; each file's own outcome is recorded
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", nargs="?", type=Path, help="a checkout of SkyPilot's repository")
    ap.add_argument("--git-dir", type=Path, help="a (bare) git directory of SkyPilot's repository instead")
    ap.add_argument("--ref", default="HEAD", help="with --git-dir: the commit to read (default HEAD)")
    ap.add_argument("--extra", type=Path, action="append", default=[],
                    help="a folder of other projects' task files (every .yaml/.yml under it); repeatable")
    ap.add_argument("--write", type=Path, help="replace the generated sections of this markdown file")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of markdown")
    args = ap.parse_args(argv)
    if (args.checkout is None) == (args.git_dir is None):
        ap.error("give a SkyPilot checkout or --git-dir, one of them")
    no_aws_environment()
    with tempfile.TemporaryDirectory(prefix="skypilot-tally-") as tmp:
        _warm_up(Path(tmp))
        root, missing = Path(tmp).resolve(), 0
        if args.checkout:
            root = args.checkout.resolve()
        else:
            missing = materialize(args.git_dir, args.ref, root)
        files = [(p, str(p.relative_to(root)), root, root) for p in yaml_files(root)]
        for extra in args.extra:
            extra = extra.resolve()
            files += [(p, f"{EXTRA}{p.relative_to(extra)}", None, extra) for p in yaml_files(extra, ())]
        results, texts = run_files(files)
        source = _describe(args, root)
    summary = tally(results)
    summary["skipped_not_task_files"] = len(files) - len(results)
    summary["blobs_missing_in_mirror"] = missing
    if args.json:
        print(json.dumps({"source": source, **summary, "results": [asdict(r) for r in results]}, indent=1))
    else:
        print(tally_markdown(results, summary, source))
    if args.write:
        doc = args.write.read_text()
        doc = replace_section(doc, "rules", rules_markdown(field_uses(texts)))
        doc = replace_section(doc, "tally", tally_markdown(results, summary, source))
        args.write.write_text(doc)
        print(f"wrote {args.write}", file=sys.stderr)
    print(f"{summary['files']} task files ({summary['skipped_not_task_files']} other YAML files skipped): "
          + ", ".join(f"{o} {n}" for o, n in summary["counts"].items())
          + f"; parse ms max {summary['parse_ms']['max']}, median {summary['parse_ms']['median']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
