"""What a job says about itself (its summary.json, the built-in bench's bench.json), checked before
ec2gpu stores, prints or computes with it.

Everything an instance writes is hostile input: the job, or the instance under it, can put any
bytes in $EC2GPU_OUTPUT_DIR/summary.json. Before a summary reaches run.json, the ledger, the
terminal or an estimate it is

- read with limits (``read_summary``): a regular file (never a link, a FIFO or a device) inside
  the run's directory, at most MAX_BYTES (64 KiB), UTF-8, JSON without NaN or Infinity, nested at
  most MAX_DEPTH (32) levels, and an object (whose keys JSON makes strings);
- masked: every secret value (engine.TaskJob.secret_values) in a key or a value, at any depth,
  becomes **** (a number whose digits hold one becomes the string ****);
- checked against the schema of the job that wrote it (``SCHEMAS``): the built-in trainer's
  (``TrainerSummary``, schema "mnist") and the built-in bench's (``BenchSummary``, "bench"), whose
  figures the ledger and the estimates read, bounded by what is physically possible
  (MAX_SAMPLES_PER_SECOND, MAX_SECONDS); any other task's summary ("task") by the limits above only.

What fails is kept, marked and never used as figures: the run record's ``summary`` is then
``{"invalid": WHY, "raw": TEXT}`` and its ``summary_schema`` (a ledger column) "invalid". WHY is one
line of at most 200 characters; TEXT the first 4,096 characters of the file as text (bad UTF-8
replaced, every non-printable character written as an escape such as \\x1b or \\n, secrets
masked). A summary that passed has ``summary_schema`` "mnist", "bench" or "task".

Reading the ledger checks every row again (``from_ledger``, ``trainer_columns``), so a row written
before these checks existed (a list for a summary, a test_acc of "x", a bench's -1 samples/s)
cannot break `ec2gpu runs`, `runs show`, `cost` or an estimate: it reads as marked, or as no figure.

The local copy, runs/<id>/outputs/summary.json, stays as the job wrote it: it is one of the job's
outputs, which come home as the job made them (like model.pt, they hold whatever the job put in
them); what ec2gpu itself stores and prints is the checked, masked record.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence, Union, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ..wire import bounded_json

MASK = "****"  # what a secret value becomes in every log, record and message (engine, logs use mask_text)
MAX_BYTES = 64 * 1024  # a summary.json (and bench.json) at most; the trainer's is ~1 KiB, the bench's ~2 KiB
MAX_DEPTH = 32  # nesting of objects and lists; the trainer's summary has 3 levels, the bench's 4
RAW_CHARS = 4096  # of an invalid file's text kept in the record
WHY_CHARS = 200
SCHEMA_NAMES = ("mnist", "bench", "task", "invalid")

#: No run lasts a year: a bound on nonsense (the instance ends itself after --max-runtime).
MAX_SECONDS = 366 * 24 * 3600.0
MAX_EPOCHS = 1_000_000
#: Instances of one run: the CLI's --nodes limit (cli/train.py, cli/tasks.py).
MAX_NODES = 64

#: The most MNIST images per second one instance of the catalog could train, from physics rather
#: than measurement: the fastest GPU of aws/catalog.py, the H100 SXM, peaks at 989.4 dense bf16
#: TFLOP/s (NVIDIA H100 datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet;
#: GPU_PEAKS in train/bench.py), and a p5.48xlarge has 8 of them; training one image costs about
#: 6 FLOPs per weight and image (2 forward, 4 backward: Kaplan et al. 2020, "Scaling Laws for
#: Neural Language Models", sec. 2.1), and the smallest preset, the mlp (784-512-512-10: 668,672
#: weights in its matrices), has the fewest, so 4.0 MFLOP per image: 8 x 989.4e12 / 4.0e6 = 2.0e9
#: images/s. Real figures are orders of magnitude lower (this project's 2-vCPU machine trained the
#: cnn at 922 images/s, `python -m ec2gpu.train.bench --quick`; on a GPU MNIST-sized steps are
#: launch-bound, costs.GPU_SPEEDUP), so this refuses only the impossible (1e12, or -1). It assumes
#: the presets' sizes: a cnn made narrower with --width needs fewer FLOPs, and a summary of one above
#: the bound would be refused, which loses a figure, never money.
H100_BF16_FLOPS = 989.4e12
GPUS_PER_INSTANCE = 8
SMALLEST_PRESET_TRAIN_FLOPS = 6 * (784 * 512 + 512 * 512 + 512 * 10)
MAX_SAMPLES_PER_SECOND = GPUS_PER_INSTANCE * H100_BF16_FLOPS / SMALLEST_PRESET_TRAIN_FLOPS  # per instance

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Accuracy = Annotated[float, Field(ge=0, le=1)]
Epochs = Annotated[int, Field(ge=0, le=MAX_EPOCHS)]
InstanceSpeed = Annotated[float, Field(gt=0, le=MAX_SAMPLES_PER_SECOND)]  # one instance (the bench)
RunSpeed = Annotated[float, Field(gt=0, le=MAX_SAMPLES_PER_SECOND * MAX_NODES)]  # a run on up to 64 nodes
Text = Annotated[str, Field(max_length=200)]
Device = Literal["cpu", "cuda"]
Measure = Annotated[float, Field(ge=0, le=1e7)]  # GB/s, TFLOP/s, ratios: finite and not negative
Figure = Annotated[float, Field(ge=0, le=1e15)]  # bench.json's bandwidth and compute entries (and their sizes)
Count = Annotated[int, Field(ge=0, le=2 ** 53)]

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")  # no "0.5" for 0.5, no True for 1
_CLOSED = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


class TrainerSummary(BaseModel):
    """summary.json of the built-in trainer (train/mnist.py, Trainer.summary): the fields ec2gpu
    reads (the ledger's columns, `ec2gpu train mnist`'s summary lines); others are kept unread."""

    model_config = _STRICT
    test_acc: Optional[Accuracy] = None
    test_loss: Optional[float] = None
    epochs: Optional[Epochs] = None
    train_seconds: Optional[Seconds] = None
    wall_seconds: Optional[Seconds] = None
    time_to_target_seconds: Optional[Seconds] = None
    samples_per_second: Optional[RunSpeed] = None
    model: Optional[Text] = None
    device: Optional[Text] = None
    gpu_name: Optional[Text] = None
    resumed_from: Optional[dict[str, Any]] = None


class BenchRow(BaseModel):
    """One model on one device in the bench's summary.json (train/bench.py, summary_of)."""

    model_config = _STRICT
    samples_per_second: InstanceSpeed
    train_seconds: Seconds
    time_to_target_seconds: Optional[Seconds] = None
    test_acc: Optional[Accuracy] = None
    epochs: Optional[Epochs] = None


class BenchSummary(BaseModel):
    """summary.json of the built-in bench (train/bench.py, summary_of): what costs.bench_speed and
    bench.usd_per_run read."""

    model_config = _STRICT
    kind: Literal["bench"]
    quick: bool = False
    best_device: Device
    gpu: Optional[Text] = None
    gpu_count: Optional[Annotated[int, Field(ge=0, le=64)]] = None
    models: dict[Annotated[str, Field(max_length=64)], dict[Device, BenchRow]]
    triad_gbs: dict[Device, Measure] = {}
    fp32_tflops: dict[Device, Measure] = {}


SCHEMAS: dict[str, type[BaseModel]] = {"mnist": TrainerSummary, "bench": BenchSummary}


class _ReportRow(BaseModel):
    model_config = _STRICT
    train_seconds: Seconds
    samples_per_second: InstanceSpeed
    test_acc: Optional[Accuracy] = None
    time_to_target_seconds: Optional[Seconds] = None
    batch_size: Optional[Annotated[int, Field(ge=1, le=10_000_000)]] = None


class _ReportModelRow(_ReportRow):
    test_acc: Accuracy
    batch_size: Annotated[int, Field(ge=1, le=10_000_000)]


class _ByDevice(BaseModel):
    model_config = _CLOSED
    cpu: Optional[_ReportModelRow] = None
    cuda: Optional[_ReportModelRow] = None
    speedup: Optional[Measure] = None


class _Gpu(BaseModel):
    model_config = _STRICT
    name: Text
    memory_bytes: Count


class _Machine(BaseModel):
    model_config = _STRICT
    cpu: Text
    vcpus: Count
    ram_bytes: Count
    gpus: list[_Gpu]
    torch: Text
    cuda: Optional[Text] = None
    driver: Optional[Text] = None


class _Training(BaseModel):
    model_config = _STRICT
    models: dict[Annotated[str, Field(max_length=64)], _ByDevice]
    batch: dict[Device, dict[Annotated[str, Field(max_length=16)], _ReportRow]]


class _Peak(BaseModel):
    model_config = _STRICT
    peak: Measure
    fraction: Measure


class BenchReport(BaseModel):
    """bench.json of the built-in bench (train/bench.py, run): what `ec2gpu bench` prints from it."""

    model_config = _STRICT
    quick: bool
    machine: _Machine
    devices: list[Device]
    bandwidth: dict[Device, dict[Annotated[str, Field(max_length=64)], Optional[Figure]]]
    compute: dict[Device, dict[Annotated[str, Field(max_length=64)], Optional[Figure]]]
    against_peak: dict[Annotated[str, Field(max_length=64)], _Peak] = {}
    training: _Training

    @model_validator(mode="after")
    def _every_device_measured(self) -> BenchReport:
        missing = [d for d in self.devices if d not in self.bandwidth or d not in self.compute]
        if missing:
            raise ValueError(f"no bandwidth or compute figures for {', '.join(missing)}")
        return self


class Invalid(ValueError):
    """Why a record was refused: one line, with nothing of the record's content but key names."""


class Checked(dict[str, Any]):
    """A job's summary after ``accept``: the (masked) object, or the invalid marker
    ``{"invalid": WHY, "raw": TEXT}``; ``schema`` says which (SCHEMA_NAMES)."""

    def __init__(self, value: dict[str, Any], schema: str) -> None:
        super().__init__(value)
        self.schema = schema


def schema_of(job: object) -> str:
    """The schema a job's summary is checked against: its built-in name (mnist, bench), else task."""
    builtin = getattr(job, "builtin", None)
    return builtin if builtin in SCHEMAS else "task"


# --- masking and making text safe to keep -------------------------------------------------------

def mask_text(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret value replaced by **** (longest first)."""
    for s in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(s, MASK)
    return text


def mask(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` (parsed JSON) with every secret value masked in its keys and strings at any depth;
    a number whose JSON text holds a secret becomes "****"."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return value
    if isinstance(value, str):
        return mask_text(value, secrets)
    if isinstance(value, dict):
        return {mask_text(str(k), secrets): mask(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, secrets) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return MASK if any(s in json.dumps(value) for s in secrets) else value
    return value


def printable(text: str) -> str:
    """``text`` with every non-printable character (controls, escape sequences' ESC, bidi
    overrides, line breaks) written as a Python escape, so it shows as it is and does nothing."""
    def esc(c: str) -> str:
        n = ord(c)
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (
            f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(c if c.isprintable() else esc(c) for c in text)


def _line(why: str, secrets: Sequence[str]) -> str:
    return mask_text(printable(mask_text(why, secrets)), secrets)[:WHY_CHARS]


def invalid(why: str, text: str = "", secrets: Sequence[str] = ()) -> Checked:
    """The marker kept instead of a record that failed: why, and the start of its text."""
    raw = mask_text(printable(mask_text(text, secrets)[:RAW_CHARS]), secrets)[:RAW_CHARS]
    return Checked({"invalid": _line(why, secrets), "raw": raw}, "invalid")


# --- parsing ---------------------------------------------------------------------------------------

def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def parse(text: str) -> object:
    """JSON ``text`` within the limits (no NaN/Infinity, MAX_DEPTH; bounded_json); raises Invalid.
    The ledger's copy may be longer than the file was: a number that holds a secret of one digit
    becomes "****", six bytes for one."""
    try:
        return bounded_json.loads(text, max_bytes=8 * MAX_BYTES, max_depth=MAX_DEPTH)
    except bounded_json.Refused as exc:
        raise Invalid(str(exc)[:WHY_CHARS]) from None


def _errors(exc: ValidationError) -> str:
    """The first three schema errors as 'where: what' (pydantic's input values left out)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'top'}: {e['msg']}" for e in exc.errors()[:3])


def _object(value: object, schema: str, secrets: Sequence[str]) -> Checked:
    if not isinstance(value, dict):
        raise Invalid(f"not a JSON object but {_kind(value)}")
    masked: dict[str, Any] = mask(value, secrets)  # an object still: mask keeps the shape
    try:
        stored = json.dumps(masked)
    except (ValueError, RecursionError):
        raise Invalid("not JSON as stored") from None
    if len(stored) > MAX_BYTES:
        raise Invalid(f"larger than {MAX_BYTES:,} bytes as stored")
    if any(s and s in stored for s in secrets):  # a secret made of JSON's own punctuation
        raise Invalid("holds a secret value")
    try:
        json.dumps(masked, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # "\ud800": no terminal could print it
        raise Invalid("holds text that is not Unicode (a lone surrogate)") from None
    model = SCHEMAS.get(schema)
    if model is not None:
        try:
            model.model_validate(masked)
        except ValidationError as exc:
            raise Invalid(f"not the {schema} summary ({_errors(exc)})") from None
    return Checked(masked, schema if schema in SCHEMA_NAMES else "task")


def accept(data: Union[bytes, str], schema: str = "task", secrets: Sequence[str] = ()) -> Checked:
    """A job's summary.json (its bytes or text) as it may be stored: the masked object that passed
    ``schema`` (SCHEMAS: mnist, bench; anything else: the limits only), else the invalid marker."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        if len(data if isinstance(data, bytes) else text.encode("utf-8", "replace")) > MAX_BYTES:
            raise Invalid(f"larger than {MAX_BYTES:,} bytes")
        if isinstance(data, bytes):
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise Invalid("not UTF-8 text") from None
        return _object(parse(text), schema, secrets)
    except Invalid as why:
        return invalid(str(why), text, secrets)


def accept_value(value: object, schema: str = "task", secrets: Sequence[str] = ()) -> Checked:
    """``accept`` for a summary already in memory (a dict made by ec2gpu, or read back)."""
    if isinstance(value, Checked) and value.schema == "invalid":
        return invalid(str(value.get("invalid", "")), str(value.get("raw", "")), secrets)
    try:
        text = json.dumps(value, default=str)
    except (ValueError, RecursionError):
        return invalid("not JSON", "", secrets)
    return accept(text, schema, secrets)


def _read(path: Path, root: Optional[Path], max_bytes: int) -> Optional[bytes]:
    """The first ``max_bytes`` + 1 bytes of ``path``; None when there is none. Raises Invalid for a
    link, anything but a regular file, or a path that leads out of ``root``."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):
        raise Invalid(f"{path.name} is a symbolic link: not read")
    if root is not None:
        real, base = os.path.realpath(path), os.path.realpath(root)
        if os.path.commonpath([real, base]) != base:
            raise Invalid(f"{path.name} leads out of the run's directory: not read")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise Invalid(f"{path.name} is a symbolic link: not read" if exc.errno == errno.ELOOP
                      else f"{path.name} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise Invalid(f"{path.name} is not a regular file: not read")
        return f.read(max_bytes + 1)


def read_summary(path: Path, schema: str = "task", secrets: Sequence[str] = (),
                 root: Optional[Path] = None) -> Optional[Checked]:
    """The job's summary.json at ``path`` (brought home from an instance, or written by a local
    job) as ``accept`` makes it; None when the job wrote none. ``root``: the run's directory, which
    ``path`` must not lead out of."""
    try:
        data = _read(Path(path), root, MAX_BYTES)
    except Invalid as why:
        return invalid(str(why), "", secrets)
    return None if data is None else accept(data, schema, secrets)


def read_bench_report(path: Path, root: Optional[Path] = None) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The bench's bench.json at ``path``: (its content, None) when it passes ``BenchReport``,
    (None, why) when it does not, (None, None) when there is none."""
    try:
        data = _read(Path(path), root, MAX_BYTES)
        if data is None:
            return None, None
        if len(data) > MAX_BYTES:
            raise Invalid(f"larger than {MAX_BYTES:,} bytes")
        try:
            value = parse(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise Invalid("not UTF-8 text") from None
        try:
            BenchReport.model_validate(value)
        except ValidationError as exc:
            raise Invalid(f"not the bench's report ({_errors(exc)})") from None
        return cast(dict[str, Any], value), None  # BenchReport, a model, validated it: an object
    except Invalid as why:
        return None, _line(f"bench.json: {why}", ())


# --- what the ledger and the estimates read ----------------------------------------------------------

_FIGURES: dict[str, TypeAdapter[Any]] = {"test_acc": TypeAdapter(Optional[Accuracy]), "epochs": TypeAdapter(Optional[Epochs]),
            "train_seconds": TypeAdapter(Optional[Seconds]), "samples_per_second": TypeAdapter(Optional[RunSpeed])}
TRAINER_COLUMNS = tuple(_FIGURES)


def figure(name: str, value: object) -> Any:
    """``value`` of the trainer's figure ``name`` (TRAINER_COLUMNS) when it is one it can be (a
    number of the right type within its bounds), else None."""
    try:
        return _FIGURES[name].validate_python(value, strict=True)
    except ValidationError:
        return None


def trainer_columns(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ledger's columns that a trainer's summary fills (test_acc, epochs, train_seconds,
    samples_per_second) from ``values``, each None where it is not a valid figure."""
    return {k: figure(k, values.get(k)) for k in TRAINER_COLUMNS}


def columns(summary: object, schema: str = "task") -> dict[str, Any]:
    """The run record's fields from a job's summary (a Checked from ``read_summary``, or a dict
    ec2gpu made, checked here against ``schema``): summary, summary_schema and, for a summary
    that holds test_acc, trainer_columns."""
    if not summary:
        return {"summary": None, "summary_schema": None}
    checked = summary if isinstance(summary, Checked) else accept_value(summary, schema)
    out = {"summary": dict(checked), "summary_schema": checked.schema}
    if checked.schema != "invalid" and "test_acc" in checked:
        out.update(trainer_columns(checked))
    return out


def from_ledger(text: object, schema: Optional[str]) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The ledger's summary column (JSON text) and summary_schema, checked again: (summary,
    schema). A summary that no longer passes (a row from before these checks) comes back marked
    invalid; a row without a schema (written before the column existed) keeps None."""
    if text is None:
        return None, None
    schema = schema if schema in SCHEMA_NAMES else None
    if not isinstance(text, str):
        return dict(invalid("not JSON text in the ledger", "")), "invalid"
    if schema == "invalid":
        try:
            v = parse(text)
        except Invalid:
            v = None
        if isinstance(v, dict) and isinstance(v.get("invalid"), str) and isinstance(v.get("raw"), str):
            return dict(invalid(v["invalid"], v["raw"])), "invalid"
        return dict(invalid("an unreadable marker in the ledger", text)), "invalid"
    checked = accept(text, schema or "task")
    return dict(checked), ("invalid" if checked.schema == "invalid" else schema)


def for_ledger(summary: object, schema: Optional[str]) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(summary, summary_schema) as ledger.record stores them: checked again, whatever the caller
    passed."""
    if summary is None:
        return None, None
    if schema == "invalid" and isinstance(summary, dict):
        marker = invalid(str(summary.get("invalid", "")), str(summary.get("raw", "")))
        return dict(marker), "invalid"
    checked = accept_value(summary, schema if schema in SCHEMAS else "task")
    return dict(checked), ("invalid" if checked.schema == "invalid" else schema)


def bench_figures(summary: object) -> Optional[BenchSummary]:
    """A bench's summary as ``BenchSummary`` (every figure within its bounds), else None: only
    these feed an estimate (costs.bench_speed) or a USD per run (bench.usd_per_run)."""
    if not isinstance(summary, dict):
        return None
    try:
        return BenchSummary.model_validate(summary)
    except ValidationError:
        return None
