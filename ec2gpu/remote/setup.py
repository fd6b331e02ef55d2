"""Instance setup: run ec2gpu/ami/setup-gpu.sh (idempotent, shipped as package data) and read what the instance has."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from fabric import Connection

from . import ssh

SCRIPT = "setup-gpu.sh"


def script_path() -> Path:
    """The setup script inside the installed package (package data: a wheel carries it too)."""
    return Path(str(resources.files("ec2gpu") / "ami" / SCRIPT))


def setup(conn: Connection, run_dir: str, log=lambda line: None) -> dict:
    """Upload and run setup-gpu.sh in ``run_dir``; return its setup.json.

    Keys: python (path of a Python with torch), torch_version, cuda_available, gpu_name,
    driver_version, gpu_count. Raises RemoteError when the script fails.
    """
    ssh.run(conn, f"mkdir -p {run_dir}")
    conn.put(str(script_path()), f"{run_dir}/{SCRIPT}")
    out = ssh.run(conn, f"bash {run_dir}/{SCRIPT} {run_dir}/setup.json", timeout_s=1800)
    for line in out.splitlines():
        log(line)
    return json.loads(ssh.run(conn, f"cat {run_dir}/setup.json"))
