"""Files the trainer writes that a reader may open at any moment (progress, summary.json, the
error file, checkpoints, the data set): written whole or not at all. Stdlib only: this travels
to the instance with the trainer (runs/execute/engine.trainer_files)."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Union


@contextlib.contextmanager
def replacing(path: Union[str, Path], binary: bool = False, fsync: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` (text, or bytes with ``binary``) for writing; when the
    block ends without an exception it replaces ``path`` (os.replace: a reader sees the old file or
    the new one, never a part), after an fsync with ``fsync`` (a checkpoint that must survive a
    power cut). On an exception the temporary file is removed and ``path`` is untouched. Raises
    OSError as the writes do."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Union[str, Path], obj: Any, indent: Union[int, None] = None) -> None:
    """``obj`` as JSON in ``path``, replaced whole (``replacing``); a trailing newline with ``indent``.
    Raises OSError, and TypeError for what JSON cannot hold."""
    text = json.dumps(obj, indent=indent) + ("\n" if indent is not None else "")
    with replacing(path) as f:
        f.write(text)
