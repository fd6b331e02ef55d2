"""MNIST: the four original IDX files, read from a directory or downloaded from public mirrors.

This module imports numpy and the standard library only, so it is safe both on the instance and
in tests. Digests are of the *uncompressed* content (the values TensorFlow's and secml's loaders
check), so a recompressed ``.gz`` with identical content is accepted; see LeCun's page
http://yann.lecun.com/exdb/mnist/ for the format.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import replacing
from .sources import DEFAULT_CACHE, FILES, MIRRORS  # noqa: F401 - this module's public names too
from .sources import candidates as _candidates


class DataError(Exception):
    """MNIST could not be read: a file is missing, truncated, corrupt, or could not be downloaded."""


@dataclass(frozen=True)
class Mnist:
    """The dataset as arrays: images uint8 [N, 28, 28], labels int64 [N]; ``md5`` per file."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str
    md5: dict[str, str]


def _read_raw(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc


def read_idx(raw: bytes) -> np.ndarray:
    """Decode one IDX blob (big-endian header: magic, dims) into a uint8 array of its shape.

    Raises DataError on a malformed header or a size that does not match the header.
    """
    if len(raw) < 8 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError("not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    if len(body) != int(np.prod(dims)):
        raise DataError(f"IDX body has {len(body)} bytes, header says {dims}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def load_file(directory: Path, name: str) -> tuple[np.ndarray, str]:
    """Read one MNIST file (``name`` or ``name.gz``) from ``directory`` and verify its md5.

    Returns (array, md5 hex). Raises DataError if missing or if the content digest differs.
    """
    size, want = FILES[name]
    for path in _candidates(directory, name):
        if path.exists():
            raw = _read_raw(path)
            got = hashlib.md5(raw).hexdigest()
            if len(raw) != size or got != want:
                raise DataError(
                    f"{path} is corrupt: md5 {got} ({len(raw)} bytes), expected {want} ({size} bytes); "
                    "delete it and let the trainer download it again"
                )
            return read_idx(raw), got
    raise DataError(f"{directory} has no {name}[.gz]")


def download(directory: Path, mirrors: tuple[str, ...] = MIRRORS, timeout: float = 60.0) -> None:
    """Download the missing MNIST files into ``directory`` (atomic rename), verifying each md5.

    Raises DataError when no mirror gives a file with the right content.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if any(p.exists() for p in _candidates(directory, name)):
            continue
        errors = []
        for mirror in mirrors:
            url = f"{mirror}{name}.gz"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    blob = resp.read()
                raw = gzip.decompress(blob)
            except Exception as exc:  # network errors come in many types; each is reported
                errors.append(f"{url}: {exc}")
                continue
            if hashlib.md5(raw).hexdigest() != FILES[name][1]:
                errors.append(f"{url}: md5 mismatch")
                continue
            with replacing(directory / f"{name}.gz", binary=True) as f:
                f.write(blob)
            break
        else:
            raise DataError(f"could not download {name}: " + "; ".join(errors))


def resolve_dir(data_dir: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """Pick the data directory: ``data_dir``, else $EC2GPU_DATA_DIR, else the cache.

    Returns (path, explicit) where explicit means the user named it (so nothing is downloaded).
    """
    if data_dir:
        return Path(data_dir).expanduser(), True
    env = os.environ.get("EC2GPU_DATA_DIR")
    if env:
        return Path(env).expanduser(), True
    return DEFAULT_CACHE, False


def load(data_dir: str | os.PathLike[str] | None = None) -> Mnist:
    """Load MNIST from ``data_dir`` / $EC2GPU_DATA_DIR, else the cache, downloading what is missing.

    Raises DataError with a message that says which file is wrong and how to fix it.
    """
    directory, explicit = resolve_dir(data_dir)
    if explicit and not directory.is_dir():
        raise DataError(f"data directory {directory} does not exist or is not a directory")
    if not explicit:
        download(directory)
    arrays, md5 = {}, {}
    for name in FILES:
        arrays[name], md5[name] = load_file(directory, name)
    return Mnist(
        train_images=arrays["train-images-idx3-ubyte"],
        train_labels=arrays["train-labels-idx1-ubyte"].astype(np.int64),
        test_images=arrays["t10k-images-idx3-ubyte"],
        test_labels=arrays["t10k-labels-idx1-ubyte"].astype(np.int64),
        source=str(directory),
        md5=md5,
    )


def copy_to(directory: Path, source: Path) -> None:
    """Copy the MNIST files from ``source`` into ``directory`` (used to seed a cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        for path in _candidates(source, name):
            if path.exists():
                shutil.copy2(path, directory / path.name)
                break


def prefetch(source: str | os.PathLike[str] | None = None, directory: Path = DEFAULT_CACHE) -> Path:
    """Put MNIST in ``directory`` (the cache the trainer reads when given no --data-dir): copied from
    ``source`` when given, else downloaded from the mirrors; then every file's md5 is checked.
    `ec2gpu image bake` runs it so an image holds the data set. Returns the directory; raises
    DataError as load does."""
    if source:
        if not Path(source).is_dir():
            raise DataError(f"data directory {source} does not exist or is not a directory")
        copy_to(directory, Path(source))
    else:
        download(directory)
    for name in FILES:
        load_file(directory, name)
    return directory


if __name__ == "__main__":  # python -m ec2gpu.train.data --prefetch [--data-dir DIR]
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="put MNIST in the trainer's cache, checked")
    parser.add_argument("--prefetch", action="store_true", required=True)
    parser.add_argument("--data-dir", help="copy from this directory instead of downloading")
    args, _ = parser.parse_known_args()
    try:
        print(f"MNIST in {prefetch(args.data_dir)} (md5 checked)")
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
