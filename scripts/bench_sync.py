"""Speed of getting code in and results out, against a sandbox instance, beside plain OpenSSH.

    .venv/bin/python scripts/bench_sync.py [--files 2000] [--mb 200] [--output-mb 500]

Starts a sandbox of its own (a temporary EC2GPU_HOME), launches one standing instance, pins its
host key, then times, each beside the plain OpenSSH command over the same SSH config:
  1. the first workdir sync (ec2gpu: ignore rules + rsync) vs `rsync -a -e 'ssh -F CONFIG'`, each
     going first once (the mean of the two)
  2. a rerun after one file changed (same pair)
  3. an output file brought home (ec2gpu: sync.pull) vs `scp -F CONFIG`
Files are random bytes (incompressible). Removes everything it made. Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mb", type=float, default=200.0, help="total size of the generated tree, MB")
    p.add_argument("--output-mb", type=int, default=500)
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    os.environ["EC2GPU_HOME"] = str(tmp / "home")
    from ec2gpu import cli
    from ec2gpu.aws import sweep
    from ec2gpu.backend import Context
    from ec2gpu.remote import ssh, sync
    from ec2gpu.sandbox import control

    tree = tmp / "tree"
    size = int(args.mb * 1e6 / args.files)
    for i in range(args.files):
        path = tree / f"d{i % 20:02d}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    home = Path(os.environ["EC2GPU_HOME"])
    state = control.up(home)
    os.environ.update(control.env_vars(state))
    rows = []
    try:
        assert cli.main(["launch", "--sandbox", "--name", "bench", "--max-runtime", "30", "--json"]) == 0
        assert cli.main(["ssh", "bench", "--sandbox", "--", "true"]) == 0  # pins the host key, writes the config
        config = home / "ssh_config"
        with Context(None, True) as ctx:
            (inst,) = [i for i in sweep.find_instances(ctx.aws.ec2, states=["running"])]
            iid = inst.id
            host, port = ctx.backend.ssh_target(inst)
            from ec2gpu.aws import network
            key = network.private_key_path(ctx.settings.keys_dir, inst.key_name or "")
            conn = ssh.connect(host, port, ctx.settings.ssh_user, key, home / "known_hosts" / iid)
            remote_home = conn.run("printf %s \"$HOME\"", hide=True).stdout
            ssh_cmd = f"ssh -F {config}"

            def plain_rsync(dest):
                subprocess.run(["rsync", "-a", "-e", ssh_cmd, f"{tree}/", f"{iid}:{dest}/"], check=True)

            # whichever goes first meets a colder instance (new directories, caches) and was 0.2-0.4 s
            # slower here: each goes first once, into directories of its own, and the two are averaged
            first_ours = timed(lambda: sync.push(conn, sync.manifest(tree), f"{remote_home}/ours1", config, iid))
            second_plain = timed(lambda: plain_rsync(f"{remote_home}/plain1"))
            first_plain = timed(lambda: plain_rsync(f"{remote_home}/plain"))
            second_ours = timed(lambda: sync.push(conn, sync.manifest(tree), f"{remote_home}/ours", config, iid))
            rows.append((f"first sync ({args.files:,} files, {args.mb:.0f} MB), each first once",
                         (first_ours + second_ours) / 2, (first_plain + second_plain) / 2))
            (tree / "d00" / "f00000.bin").write_bytes(os.urandom(size))
            ours = timed(lambda: sync.push(conn, sync.manifest(tree), f"{remote_home}/ours", config, iid))
            plain = timed(lambda: plain_rsync(f"{remote_home}/plain"))
            rows.append(("rerun, one file changed", ours, plain))
            conn.run(f"mkdir -p {remote_home}/out && head -c {args.output_mb}M /dev/urandom > {remote_home}/out/big.bin",
                     hide=True)
            ours = timed(lambda: sync.pull(conn, f"{remote_home}/out", tmp / "home-ours", [], config, iid))
            (tmp / "home-plain").mkdir()
            plain = timed(lambda: subprocess.run(["scp", "-q", "-F", str(config), f"{iid}:{remote_home}/out/big.bin",
                                                  str(tmp / "home-plain" / "big.bin")], check=True))
            rows.append((f"output home ({args.output_mb} MB, one file)", ours, plain))
            conn.close()
    finally:
        cli.main(["down", "bench", "--sandbox"])
        control.down(home)
        subprocess.run(["rm", "-rf", str(tmp)])
    print(f"{'what':56} {'ec2gpu':>9} {'OpenSSH':>9} {'ratio':>6}")
    for what, ours, plain in rows:
        print(f"{what:56} {ours:8.2f}s {plain:8.2f}s {ours / plain:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
