"""The sandbox daemon: moto's AWS server, a checkip and metadata endpoint, one sshd per running instance.

Run as ``python -m ec2gpu.sandbox.server STATE_DIR`` (``ec2gpu sandbox up`` does it). It writes
STATE_DIR/state.json (endpoint, pids, instance -> SSH address) atomically and keeps it current:
every instance that is running in the emulator gets an sshd on 127.0.0.N that accepts the
instance's key pair, and on its first boot runs its user data as cloud-init would (cloudinit.py);
an instance that is terminated or stopped (or vanishes) has its sshd and processes stopped. Each
instance's sessions reach their own instance metadata service (imds.py) at EC2GPU_IMDS_ENDPOINT,
where `ec2gpu sandbox interrupt` publishes spot interruption notices, and the daemon's control
endpoint at EC2GPU_SANDBOX_CONTROL, where `shutdown` on the instance asks to be ended (guest.py).
An AWS SDK on an instance finds the same metadata service through its own standard variable
AWS_EC2_METADATA_SERVICE_ENDPOINT, and with it the credentials of the instance's role (roles.py),
and the emulated S3, Auto Scaling and SSM through AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL_AUTO_SCALING
and AWS_ENDPOINT_URL_SSM; no credentials of this machine reach an instance.
With EC2GPU_SANDBOX_LIKE_AWS=1 it behaves like EC2 where moto does not (likeaws.py).
Auto Scaling groups launch from their launch templates, replace instances that fail their health
check, and run their scheduled actions (autoscaling.py, one pass each tick of the loop).
SIGTERM stops everything it started.
"""
from __future__ import annotations

import gzip
import http.server
import json
import os
from typing import Any
import signal
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

from . import (autoscaling, bindshim, capacity, cloudinit, console, dlami, images, imds, lifecycle, likeaws, placement, presigned,
               quotas, roles, sshd, tls)

def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _amis_file(state_dir: Path) -> Path:
    default = json.loads(gzip.decompress((resources.files("moto") / "ec2/resources/amis.json.gz").read_bytes()))
    path = state_dir / "amis.json"
    path.write_text(json.dumps(default + list(dlami.IMAGES.values())))
    return path


class Http(http.server.BaseHTTPRequestHandler):
    """GET /checkip -> the client's address, as https://checkip.amazonaws.com answers; everything
    else is the instance metadata service and its control endpoint (imds.py)."""

    meta: imds.Metadata
    find = staticmethod(lambda instance_id: None)
    role_of = staticmethod(lambda instance_id: None)  # the ARN of its instance profile's role (roles.py)
    mint: Any = staticmethod(lambda instance_id, role_arn: {})  # that role's credentials (roles.py)
    zone_of = staticmethod(lambda instance_id: None)
    address_of = staticmethod(lambda instance_id: None)  # its sshd's loopback address: its private one
    shutdown: Any = staticmethod(lambda request: {})

    def _answer(self, method: str) -> None:
        if method == "GET" and self.path.startswith("/checkip"):
            status, ctype, text = 200, "text/plain", self.client_address[0] + "\n"
        elif method == "POST" and self.path == "/control/capacity":
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length))
                status, ctype, text = 200, "application/json", json.dumps(
                    {"limits": capacity.limit(req["instance_type"], req.get("count"))})
            except (LookupError, ValueError, TypeError) as exc:
                status, ctype, text = 400, "application/json", json.dumps({"error": str(exc).strip("'")})
        elif method == "POST" and self.path == "/control/shutdown":
            length = int(self.headers.get("Content-Length") or 0)
            try:
                status, ctype, text = 200, "application/json", json.dumps(self.shutdown(json.loads(self.rfile.read(length))))
            except (LookupError, ValueError, TypeError) as exc:
                status, ctype, text = 400, "application/json", json.dumps({"error": str(exc).strip("'")})
        else:
            length = int(self.headers.get("Content-Length") or 0)
            status, ctype, text = imds.handle(self.meta, method, self.path, self.headers,
                                              self.rfile.read(length) if length else b"", self.find,
                                              role_of=self.role_of, mint=self.mint, zone_of=self.zone_of,
                                              address_of=self.address_of)
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


def end_from_inside(instance_id: str) -> str:
    """The instance's OS shut down: stop or terminate it as its InstanceInitiatedShutdownBehavior
    says, with the reason EC2 gives (Client.InstanceInitiatedShutdown). Returns the new state."""
    from moto.ec2.models.instances import StateReason

    inst = _moto_instance(instance_id)
    if inst is None or inst.state not in ("pending", "running"):
        return inst.state if inst else "unknown"
    if inst.instance_initiated_shutdown_behavior == "terminate":
        inst.terminate()
    else:
        inst.stop()
    inst._reason = f"User initiated ({datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} GMT)"
    inst.state_reason = StateReason("Client.InstanceInitiatedShutdown: Instance initiated shutdown",
                                    "Client.InstanceInitiatedShutdown")
    return inst.state


def find_instance(instance_id: str) -> tuple[str, str] | None:
    """(state, 'spot' | 'on-demand') of a sandbox instance, or None."""
    inst = _moto_instance(instance_id)
    return (inst.state, "spot" if inst.lifecycle == "spot" else "on-demand") if inst else None


def instance_zone(instance_id: str) -> str | None:
    """The availability zone of a sandbox instance (moto's placement), or None."""
    inst = _moto_instance(instance_id)
    return inst.availability_zone if inst else None


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


def moto_server(host: str, port: int, middleware=None):
    """moto's ThreadedMotoServer, its WSGI app wrapped in ``middleware`` (the AWS-like mode) when given."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:  # moto's own, with the app wrapped
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, middleware(app) if middleware else app, True)
            self._server_ready_event.set()
            self._server.serve_forever()

    return Server(ip_address=host, port=port, verbose=False)


class Sandbox:
    """The daemon's state: moto server, instance sshds, the state file."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1"):
        self.state_dir, self.host = state_dir, host
        self.instances: dict[str, sshd.SshdInstance] = {}
        self.running_since: dict[str, float] = {}  # instance id -> when reconcile first saw it running
        self.booted: set[str] = set()  # instances whose user data ran (once per instance, as cloud-init)
        self.shutdowns: dict[str, threading.Timer] = {}  # scheduled `shutdown +N` per instance
        self.shutdown_at: dict[str, str] = {}  # ... and when (ISO 8601 UTC), shown in state.json
        self._save_lock = threading.Lock()  # the reconcile loop and the HTTP threads both save
        self.next_address = 2
        self.stopping = threading.Event()
        self.instance_env = json.loads(os.environ.get("EC2GPU_SANDBOX_INSTANCE_ENV", "{}"))
        self.like_aws = likeaws.Behaviour.from_env()

    def start(self) -> None:
        os.environ["MOTO_AMIS_PATH"] = str(_amis_file(self.state_dir))
        from . import market  # moto is imported after MOTO_AMIS_PATH: it reads it on import
        market.install()  # a simulated spot market instead of moto's 0.00001 USD/h
        market.install_spot_role()  # the first spot request creates AWSServiceRoleForEC2Spot, as on EC2
        dlami.install_parameters()  # the DLAMIs' and Canonical's SSM public parameters
        lifecycle.install()  # a start sets LaunchTime again, as on EC2
        tls.install()  # a request comes over TLS, as boto3's do on AWS: a TLS-only bucket policy lets it in
        roles.install()  # RunInstances gives the instance profile to every instance it launches
        capacity.install()  # RunInstances launches up to MaxCount, within `sandbox capacity` limits
        autoscaling.install()  # groups launch from their templates; scheduled actions per group
        placement.install()  # placement groups kept, described and deleted as EC2 does
        quotas.install()  # Service Quotas answers for the G and VT vCPU quotas, as for an account
        images.install(self.state_dir,  # CreateImage keeps the builder's home; reboots reboot
                       pending_s=self.like_aws.image_pending_s if self.like_aws else 0.0)
        console.install(self.state_dir / "instances",  # cloud-init's host key fingerprints
                        delay_s=self.like_aws.console_delay_s if self.like_aws else 0.0)
        like_aws = self.like_aws
        if like_aws:
            likeaws.install_pending(like_aws)

        def middleware(app: Any) -> Any:  # S3 refuses a presigned URL past its end, as on AWS (presigned.py)
            return presigned.Middleware(likeaws.Middleware(app, like_aws) if like_aws else app)

        port = sshd.free_port(self.host)
        self.moto = moto_server(self.host, port, middleware)
        self.moto.start()
        self.endpoint = f"http://{self.host}:{port}"
        self.meta = imds.Metadata(reclaim_spot_instance)
        self.scaler = autoscaling.Scaler(rebalanced=self.rebalanced)
        handler = type("Handler", (Http,), {"meta": self.meta,
                                            "find": staticmethod(find_instance),
                                            "role_of": staticmethod(roles.role_of), "mint": staticmethod(roles.mint),
                                            "zone_of": staticmethod(instance_zone),
                                            "address_of": staticmethod(self.address_of),
                                            "shutdown": staticmethod(self.shutdown_request)})
        self.http = http.server.ThreadingHTTPServer((self.host, 0), handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        base = f"http://{self.host}:{self.http.server_address[1]}"
        self.checkip_url, self.imds_url, self.control_url = f"{base}/checkip", base, base
        self.save()

    def address_of(self, instance_id: str) -> str | None:
        """The private address of a running sandbox instance: the loopback address its sshd listens
        on and its processes use (IMDS local-ipv4), or None."""
        s = self.instances.get(instance_id)
        return s.host if s is not None else None

    def rebalanced(self) -> set[str]:
        """The instances that received a rebalance recommendation (`sandbox interrupt --rebalance`)."""
        with self.meta.lock:
            return set(self.meta.rebalances)

    def shutdown_request(self, request: dict) -> dict:
        """`shutdown` on an instance (guest.py): schedule, cancel, or do at once what EC2 does when
        an instance's OS powers off. Raises LookupError for an unknown instance."""
        iid = request["instance_id"]
        if find_instance(iid) is None:
            raise LookupError(f"{iid} is not a sandbox instance")
        old = self.shutdowns.pop(iid, None)
        if old:
            old.cancel()
        if request.get("action") == "cancel":
            self.shutdown_at.pop(iid, None)
            self.save()
            return {"instance_id": iid, "cancelled": bool(old)}
        delay = max(0.0, float(request.get("delay_s", 0)))
        timer = threading.Timer(delay, end_from_inside, args=(iid,))
        timer.daemon = True
        timer.start()
        self.shutdowns[iid] = timer
        at = datetime.fromtimestamp(datetime.now(timezone.utc).timestamp() + delay, timezone.utc).isoformat()
        self.shutdown_at[iid] = at
        self.save()
        return {"instance_id": iid, "delay_s": delay, "at": at}

    def save(self) -> None:
        with self._save_lock:
            write_json(self.state_dir / "state.json", {
                "pid": os.getpid(), "endpoint": self.endpoint, "checkip_url": self.checkip_url,
                "imds_url": self.imds_url, "like_aws": bool(self.like_aws),
                "instances": {i: {"host": s.host, "port": s.port, "sshd_pid": s.pid, "directory": str(s.directory)}
                              for i, s in list(self.instances.items())},
                "shutdowns": dict(self.shutdown_at),  # instance id -> when its OS powers off (`shutdown +N`)
                # the library its instances' Ray preloads (bindshim.for_sandbox checks a running daemon names it)
                "bind_shim": str(bindshim.library(self.state_dir)),
            })

    def _running(self) -> dict[str, tuple[str, object]]:
        """instance id -> (public key of its key pair, moto's Instance), for every running instance."""
        from moto.ec2.models import ec2_backends

        out: dict[str, tuple[str, object]] = {}
        for account in list(ec2_backends.keys()):
            for region in list(ec2_backends[account].keys()):
                backend = ec2_backends[account][region]
                for inst in list(backend.all_instances()):
                    if inst.state == "running" and inst.key_name in backend.key_pairs:
                        out[inst.id] = (backend.key_pairs[inst.key_name].material_public.decode(), inst)
        return out

    def _boot(self, iid: str, key: str, inst) -> None:
        """Start the instance's sshd on an address of its own and, on its first boot, its user data."""
        directory = self.state_dir / "instances" / iid
        sbin = cloudinit.install_shims(directory)
        env = {**{k: v for k, v in self.instance_env.items() if k not in roles.CREDENTIAL_VARS},
               "PATH": f"{sbin}:{self.instance_env.get('PATH', os.environ['PATH'])}",
               "EC2GPU_IMDS_ENDPOINT": f"{self.imds_url}/{iid}", "EC2GPU_SANDBOX_CONTROL": self.control_url,
               # an AWS SDK's own settings: its metadata service (the role's credentials; botocore
               # joins this base with "latest/api/token") and the emulated S3; no keys, ever
               "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"{self.imds_url}/{iid}/", "AWS_ENDPOINT_URL_S3": self.endpoint,
               "AWS_ENDPOINT_URL_AUTO_SCALING": self.endpoint,  # a detached run's agent ends its own group
               "AWS_ENDPOINT_URL_SSM": self.endpoint,  # and reads its secrets (aws/parameters.py)
               # the instance's own state directory and console (ami/idle-watch.sh; console.py shows it)
               "EC2GPU_STATE_DIR": str(directory / "state"), "EC2GPU_CONSOLE": str(directory / console.CONSOLE_LOG),
               "EC2GPU_BOOT_ID_FILE": str(directory / "boot_id"),  # a new id each boot, as the kernel's
               # the instance's "/": an absolute file_mounts target lands under it, never on this
               # machine's own / (remote/mounts.py; the job finds it there, docs/tasks.md)
               "EC2GPU_SANDBOX_ROOT": str(directory / "root"),
               # the library that keeps a pool's Ray on the instance's own address (built by the
               # controller before a sandbox array launches; node.py refuses to start Ray without it)
               bindshim.SHIM_VAR: str(bindshim.library(self.state_dir))}
        if iid not in self.booted:  # launched from an image made here: its disk holds what the builder's did
            images.seed_home(self.state_dir, inst.image_id, directory / "home")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "boot_id").write_text(f"{uuid.uuid4()}\n")
        host = f"127.0.0.{self.next_address}"
        self.next_address = 2 if self.next_address >= 254 else self.next_address + 1
        self.instances[iid] = sshd.start(iid, directory, host, key, env)
        if iid not in self.booted:
            self.booted.add(iid)
            s = self.instances[iid]
            cloudinit.run_user_data(directory, cloudinit.decoded_user_data(inst),
                                    {**sshd.session_env(iid, directory, env), **sshd.own_sshd(s.host, s.port)})

    def reconcile(self) -> None:
        """Start sshd for new running instances (in the AWS-like mode, a moment after they run);
        stop it for the ones no longer running."""
        try:
            running = self._running()
        except RuntimeError:  # a dict changed size while moto served a request: try next tick
            return
        changed, now = False, time.monotonic()
        delay = self.like_aws.sshd_delay_s if self.like_aws else 0.0
        for iid, (key, inst) in running.items():
            since = self.running_since.setdefault(iid, now)
            if iid not in self.instances and now - since >= delay:
                self._boot(iid, key, inst)
                changed = True
        for iid in [i for i in self.running_since if i not in running]:
            del self.running_since[iid]
        rebooted = images.rebooted()  # RebootInstances: the OS goes down and comes up again (next tick)
        for iid in [i for i in self.instances if i not in running or i in rebooted]:
            s = self.instances.pop(iid)
            sshd.stop(s.pid, iid)
            timer = self.shutdowns.pop(iid, None)  # a `shutdown +N` does not survive the OS stopping
            if timer:
                timer.cancel()
            self.shutdown_at.pop(iid, None)
            changed = True
        if changed:
            self.save()

    def loop(self, interval_s: float = 0.2) -> None:
        while not self.stopping.is_set():
            try:
                self.scaler.reconcile()  # before the sshds: a group's new instance boots this same tick
            except Exception as exc:  # a moto dict changed size under a request: next tick
                print(f"autoscaling: {type(exc).__name__}: {exc}", flush=True)
            self.reconcile()
            self.stopping.wait(interval_s)
        for timer in self.shutdowns.values():
            timer.cancel()
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
