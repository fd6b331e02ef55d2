"""The one reader of JSON that comes from outside this process's control (issue 44): what an
instance, a job, S3 or the network wrote, on the controller and in the agent on the instance.

Standard library only, and no import of the package: it is shipped to instances as a flat file
beside agent.py, detached.py, s3files.py and notebook.py, which import it as ``bounded_json``
(runs/detached/launch.AGENT_FILES, runs/execute/engine.py, remote/mounts.py and
runs/standing/notebook.py put it there), and the controller imports it as ``ec2gpu.wire.bounded_json``.

A record is refused, with one exception (``Refused``, a ValueError: a caller's ``except ValueError``
that treats bad JSON as no record treats a refused one the same) whose message says what was wrong
in plain words, when it is

- larger than the caller's ``max_bytes`` (its UTF-8 bytes): "over 65,536 bytes";
- nested deeper than ``max_depth`` objects and lists (64 unless the caller says): "nested deeper
  than 64 levels". Python's JSON parser recurses once per level and raises RecursionError near
  the interpreter's recursion limit (1,000 frames): ``'[' * 50000 + ']' * 50000``, 100 KB, once
  ended `ec2gpu run` with a traceback. That error is caught here, and a document the parser could
  read is measured after, without recursion;
- not JSON: not UTF-8 text, not JSON's grammar, NaN or Infinity (JSON has neither: Python's
  parser accepts them unless told not to; ``allow_nan=True`` for a caller that wants them), a
  number beyond a float's range (1e999) or an integer of over 4,300 digits (Python's
  int_max_str_digits): "not JSON (line 1, column 7)", "not JSON: NaN is not a number";
- read from a path (``read``) that is not a regular file: a FIFO (whose open would wait for a writer
  for ever: the torchrun error file and a pool's table.json are paths the job controls), a device, a
  directory, or with ``follow=False`` a symbolic link: "not a regular file (a FIFO)".
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any, NoReturn

#: objects and lists inside each other at most, unless a caller says: the deepest record ec2gpu
#: writes (a pool's table.json: object, elements list, element, tail list) has 4 levels
MAX_DEPTH = 64


#: why a record was refused (Refused.reason): a caller may treat a file caught half written (not
#: JSON) apart from one that can never be read
TOO_LARGE, TOO_DEEP, NOT_JSON, NOT_A_FILE = "too large", "too deep", "not JSON", "not a regular file"


class Refused(ValueError):
    """A record refused: its message says why in plain words ("over 65,536 bytes", "nested deeper
    than 64 levels", "not JSON (line 1, column 2)"); ``reason`` is TOO_LARGE, TOO_DEEP, NOT_JSON or NOT_A_FILE."""

    def __init__(self, message: str, reason: str = NOT_JSON) -> None:
        super().__init__(message)
        self.reason = reason


def _constant(name: str) -> NoReturn:
    raise Refused(f"not JSON: {name} is not a number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused("not JSON: a number out of range")
    return value


def _deeper_than(value: Any, max_depth: int) -> bool:
    """Whether ``value`` holds objects and lists nested deeper than ``max_depth`` (an iterative
    walk over its containers: no recursion, whatever the depth)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list)))
    return False


def loads(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH, allow_nan: bool = False) -> Any:
    """The JSON value in ``data`` (bytes: UTF-8; or text, measured as its UTF-8 bytes), when it is
    at most ``max_bytes`` bytes and nested at most ``max_depth`` levels (a scalar 0, ``[]`` 1,
    ``[[]]`` 2); NaN, Infinity and numbers beyond a float's range refused unless ``allow_nan``.
    Raises Refused (a ValueError) otherwise; never RecursionError, whatever the input."""
    if len(data) > max_bytes or (isinstance(data, str) and len(data.encode("utf-8", "surrogatepass")) > max_bytes):
        raise Refused(f"over {max_bytes:,} bytes", TOO_LARGE)
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError:
        raise Refused("not JSON (not UTF-8 text)") from None
    try:
        value = json.loads(text) if allow_nan else json.loads(text, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise Refused(f"nested deeper than {max_depth} levels", TOO_DEEP) from None
    except Refused:
        raise
    except json.JSONDecodeError as exc:
        raise Refused(f"not JSON (line {exc.lineno}, column {exc.colno})") from None
    except ValueError:  # an integer of over 4,300 digits (sys.int_info.default_max_str_digits)
        raise Refused("not JSON: a number out of range") from None
    if _deeper_than(value, max_depth):
        raise Refused(f"nested deeper than {max_depth} levels", TOO_DEEP)
    return value


#: what a file's type is called in a refusal (stat(2)'s S_IF* types)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


def read(path: str, *, max_bytes: int, max_depth: int = MAX_DEPTH, allow_nan: bool = False,
         follow: bool = True) -> Any:
    """``loads`` of the regular file at ``path``, of which at most ``max_bytes`` + 1 bytes are read (one
    more than allowed tells an over-long file from one that fits). It is opened without waiting
    (O_NONBLOCK: a FIFO's open would wait for a writer), and with ``follow=False`` a symbolic link at
    ``path`` is not followed (O_NOFOLLOW); what fstat(2) then finds is no regular file is refused
    (open(2), https://man7.org/linux/man-pages/man2/open.2.html). Raises Refused, and OSError (no
    file there, no permission)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a link
            raise Refused("not a regular file (a symbolic link)", NOT_A_FILE) from None
        raise
    mode = os.fstat(fd).st_mode  # before open(): Python's own file object refuses a directory with an OSError
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "something else")
        raise Refused(f"not a regular file ({kind})", NOT_A_FILE)
    with open(fd, "rb") as f:
        return loads(f.read(max_bytes + 1), max_bytes=max_bytes, max_depth=max_depth, allow_nan=allow_nan)
