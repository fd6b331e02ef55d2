"""The sandbox's stand-in for the VPC and security group in front of a pool's Ray (issue 44, item 1).

On EC2 Ray's ports reach the pool's own members only (aws/network.allow_within_group). A sandbox
instance is this machine, and Ray's servers bind every address (gcs_server, the raylets, the
autoscaler's monitor: Ray has no option for it), so any host of the user's network could reach
them. ``bindshim.c`` (built here once per source, by this machine's C compiler, into the
sandbox's state directory) is preloaded into a sandbox instance's Ray processes and its pool's
driver: a bind to the wildcard address (0.0.0.0, ::, ::ffff:0.0.0.0), and a listen on a socket not
bound (which Linux would bind to it), becomes a bind to the instance's own 127.0.0.N. The sandbox names the built
library in its instances' environment (SHIM_VAR, server.py); ec2gpu/pool/node.py preloads it for
``ray start`` and the pool's driver, and refuses to start Ray on a sandbox instance without it.
api/ builds it (for_sandbox) before a sandbox array creates anything: pool/ never imports sandbox/.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import UsageError
from . import control

SOURCE = Path(__file__).with_name("bindshim.c")
#: the instances' variable that names the built library (ec2gpu/pool/node.py reads it)
SHIM_VAR = "EC2GPU_SANDBOX_BIND_SHIM"
COMPILERS = ("cc", "gcc", "clang")
BUILD_S = 120.0  # a compiler that has not built one small file in this long has failed (s)
HINT = "install a C compiler (apt-get install gcc), then run the command again"


def library(state_dir: Path) -> Path:
    """Where the library built from this SOURCE is (pure but for reading SOURCE): one file per
    source text, so a changed shim is built again and never mixed up with an older one."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return Path(state_dir) / f"bindshim-{digest}.so"


def build(state_dir: Path) -> Path:
    """The shim library for the sandbox whose state directory is ``state_dir``: built now with
    this machine's C compiler unless it is there already (written whole: two commands building at
    once each rename their own). Raises UsageError (exit 2, before anything is created) when no
    compiler is found or the build fails: a sandbox array without it would have Ray listening on
    every address."""
    out = library(state_dir)
    if out.is_file():
        return out
    cc = next((found for name in COMPILERS if (found := shutil.which(name))), None)
    if cc is None:
        raise UsageError("an array in the sandbox needs a C compiler (cc), to keep Ray on each instance's own "
                         "loopback address", HINT)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(part), str(SOURCE), "-ldl"],
                              capture_output=True, text=True, timeout=BUILD_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        part.unlink(missing_ok=True)
        raise UsageError(f"the sandbox's bind shim was not built ({cc}: {type(exc).__name__})", HINT) from None
    if done.returncode != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        first = next((line for line in done.stderr.splitlines() if line.strip()), "no output")[:200]
        raise UsageError(f"the sandbox's bind shim was not built ({cc} exited {done.returncode}: {first})", HINT)
    os.replace(part, out)
    return out


def for_sandbox(home: Path) -> Path:
    """The shim library for the sandbox of the tool home ``home``, built into its state directory
    (build; the daemon names that same file to its instances). Raises UsageError as build does, and
    when the sandbox running now names no library or another one (a daemon an older ec2gpu started,
    or one from before the shim changed): its instances would refuse to start Ray only after the
    array's instances were made."""
    out = build(control.state_dir(home))
    state = control.read_state(home)
    if state and state.get("bind_shim") != str(out):
        raise UsageError("the sandbox running now was started by an older ec2gpu: its instances cannot keep Ray on "
                         "their own loopback address", "restart it: ec2gpu sandbox down && ec2gpu sandbox up")
    return out
