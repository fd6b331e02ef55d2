"""Where MNIST comes from: the four original IDX files, their sizes and digests, the public
mirrors, the local cache. Standard library only, so the controller can ask whether a directory
holds the data set without importing numpy (data.py reads the files)."""
from __future__ import annotations

import os
from pathlib import Path

#: name -> (bytes uncompressed, md5 of the uncompressed IDX content). Source: the checksums
#: published with the original files (also listed in shared/data/mnist/README.md).
FILES: dict[str, tuple[int, str]] = {
    "train-images-idx3-ubyte": (47040016, "6bbc9ace898e44ae57da46a324031adb"),
    "train-labels-idx1-ubyte": (60008, "a25bea736e30d166cdddb491f175f624"),
    "t10k-images-idx3-ubyte": (7840016, "2646ac647ad5339dbf082846283269ea"),
    "t10k-labels-idx1-ubyte": (10008, "27ae3e4e09519cfbb04c329615203637"),
}

#: Public mirrors tried in order (the same list torchvision uses, as of 2026-11).
MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ec2gpu" / "mnist"


def candidates(directory: Path, name: str) -> list[Path]:
    """The paths file ``name`` may have in ``directory``: gzipped or not."""
    return [directory / f"{name}.gz", directory / name]


def has_all(directory: Path) -> bool:
    """Whether ``directory`` holds all four files (present, not checked: data.load checks them)."""
    return all(any(p.is_file() for p in candidates(directory, name)) for name in FILES)
