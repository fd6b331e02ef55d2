"""The sandbox daemon: moto's AWS server, a checkip and metadata endpoint, one sshd per running instance.

Run as ``python -m ec2gpu.sandbox.server STATE_DIR`` (``ec2gpu sandbox up`` does it). It writes
STATE_DIR/state.json (endpoint, pids, instance -> SSH address) atomically and keeps it current:
every instance that is running in the emulator gets an sshd on 127.0.0.N that accepts the
instance's key pair; an instance that is terminated (or vanishes) has its sshd and processes
stopped. Each instance's sessions reach their own instance metadata service (imds.py) at
EC2GPU_IMDS_ENDPOINT, where `ec2gpu sandbox interrupt` publishes spot interruption notices.
SIGTERM stops everything it started.
"""
from __future__ import annotations

import gzip
import http.server
import json
import os
import signal
import sys
import threading
from importlib import resources
from pathlib import Path

from . import imds, sshd

#: The sandbox's stand-in for the AWS Deep Learning AMI, found the way images.py finds the real one.
DLAMI = {
    "ami_id": "ami-0ec29b0d1a0000001", "state": "available", "public": True,
    "owner_id": "898082745236", "image_location": "amazon/ec2gpu-sandbox-dlami",
    "sriov": "simple", "root_device_type": "ebs", "root_device_name": "/dev/sda1",
    "description": "ec2gpu sandbox stand-in for the Deep Learning OSS Nvidia Driver AMI (PyTorch)",
    "image_type": "machine", "platform": None, "architecture": "x86_64",
    "name": "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04) 20251101",
    "virtualization_type": "hvm", "hypervisor": "xen", "creation_date": "2025-11-01T00:00:00.000Z",
}


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _amis_file(state_dir: Path) -> Path:
    default = json.loads(gzip.decompress((resources.files("moto") / "ec2/resources/amis.json.gz").read_bytes()))
    path = state_dir / "amis.json"
    path.write_text(json.dumps(default + [DLAMI]))
    return path


class Http(http.server.BaseHTTPRequestHandler):
    """GET /checkip -> the client's address, as https://checkip.amazonaws.com answers; everything
    else is the instance metadata service and its control endpoint (imds.py)."""

    meta: imds.Metadata
    find = staticmethod(lambda instance_id: None)

    def _answer(self, method: str) -> None:
        if method == "GET" and self.path.startswith("/checkip"):
            status, ctype, text = 200, "text/plain", self.client_address[0] + "\n"
        else:
            length = int(self.headers.get("Content-Length") or 0)
            status, ctype, text = imds.handle(self.meta, method, self.path, self.headers,
                                              self.rfile.read(length) if length else b"", self.find)
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer("GET")

    def do_PUT(self):
        self._answer("PUT")

    def do_POST(self):
        self._answer("POST")

    def log_message(self, *args):
        pass


def _moto_instance(instance_id: str):
    """moto's Instance object for ``instance_id`` in any account and region, or None."""
    from moto.ec2.models import ec2_backends

    for account in list(ec2_backends.keys()):
        for region in list(ec2_backends[account].keys()):
            for inst in list(ec2_backends[account][region].all_instances()):
                if inst.id == instance_id:
                    return inst
    return None


def find_instance(instance_id: str) -> tuple[str, str] | None:
    """(state, 'spot' | 'on-demand') of a sandbox instance, or None."""
    inst = _moto_instance(instance_id)
    return (inst.state, "spot" if inst.lifecycle == "spot" else "on-demand") if inst else None


def reclaim_spot_instance(instance_id: str) -> None:
    """Terminate ``instance_id`` in the emulator as EC2 does at the end of a spot notice: state
    terminated, StateReason Server.SpotInstanceTermination, the time in StateTransitionReason."""
    from datetime import datetime, timezone

    from moto.ec2.models.instances import StateReason

    inst = _moto_instance(instance_id)
    if inst is None or inst.state in ("terminated", "shutting-down"):
        return
    inst.terminate()
    inst._reason = f"Service initiated ({datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} GMT)"
    inst.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                    "Server.SpotInstanceTermination")


class Sandbox:
    """The daemon's state: moto server, instance sshds, the state file."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1"):
        self.state_dir, self.host = state_dir, host
        self.instances: dict[str, sshd.SshdInstance] = {}
        self.next_address = 2
        self.stopping = threading.Event()
        self.instance_env = json.loads(os.environ.get("EC2GPU_SANDBOX_INSTANCE_ENV", "{}"))

    def start(self) -> None:
        os.environ["MOTO_AMIS_PATH"] = str(_amis_file(self.state_dir))
        from moto.server import ThreadedMotoServer  # after MOTO_AMIS_PATH: moto reads it on import

        from . import console, market
        market.install()  # a simulated spot market instead of moto's 0.00001 USD/h
        console.install(self.state_dir / "instances")  # cloud-init's host key fingerprints

        port = sshd.free_port(self.host)
        self.moto = ThreadedMotoServer(ip_address=self.host, port=port, verbose=False)
        self.moto.start()
        self.endpoint = f"http://{self.host}:{port}"
        handler = type("Handler", (Http,), {"meta": imds.Metadata(reclaim_spot_instance),
                                            "find": staticmethod(find_instance)})
        self.http = http.server.ThreadingHTTPServer((self.host, 0), handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        base = f"http://{self.host}:{self.http.server_address[1]}"
        self.checkip_url, self.imds_url = f"{base}/checkip", base
        self.save()

    def save(self) -> None:
        write_json(self.state_dir / "state.json", {
            "pid": os.getpid(), "endpoint": self.endpoint, "checkip_url": self.checkip_url,
            "imds_url": self.imds_url,
            "instances": {i: {"host": s.host, "port": s.port, "sshd_pid": s.pid, "directory": str(s.directory)}
                          for i, s in self.instances.items()},
        })

    def _running(self) -> dict[str, str]:
        """instance id -> public key of its key pair, for every running instance in every region."""
        from moto.ec2.models import ec2_backends

        out = {}
        for account in list(ec2_backends.keys()):
            for region in list(ec2_backends[account].keys()):
                backend = ec2_backends[account][region]
                for inst in list(backend.all_instances()):
                    if inst.state == "running" and inst.key_name in backend.key_pairs:
                        out[inst.id] = backend.key_pairs[inst.key_name].material_public.decode()
        return out

    def reconcile(self) -> None:
        """Start sshd for new running instances; stop it for the ones no longer running."""
        try:
            running = self._running()
        except RuntimeError:  # a dict changed size while moto served a request: try next tick
            return
        changed = False
        for iid, key in running.items():
            if iid not in self.instances:
                host = f"127.0.0.{self.next_address}"
                self.next_address = 2 if self.next_address >= 254 else self.next_address + 1
                env = {**self.instance_env, "EC2GPU_IMDS_ENDPOINT": f"{self.imds_url}/{iid}"}
                self.instances[iid] = sshd.start(iid, self.state_dir / "instances" / iid, host, key, env)
                changed = True
        for iid in [i for i in self.instances if i not in running]:
            s = self.instances.pop(iid)
            sshd.stop(s.pid, iid)
            changed = True
        if changed:
            self.save()

    def loop(self, interval_s: float = 0.2) -> None:
        while not self.stopping.is_set():
            self.reconcile()
            self.stopping.wait(interval_s)
        for iid, s in list(self.instances.items()):
            sshd.stop(s.pid, iid)
        self.instances.clear()
        self.http.shutdown()
        self.moto.stop()
        (self.state_dir / "state.json").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    state_dir = Path(argv[0])
    state_dir.mkdir(parents=True, exist_ok=True)
    box = Sandbox(state_dir)
    signal.signal(signal.SIGTERM, lambda *_: box.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: box.stopping.set())
    box.start()
    print(f"sandbox up: {box.endpoint}", flush=True)
    box.loop()
    print("sandbox down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
