"""The sandbox's console output: what cloud-init prints on a real instance, host key fingerprints included.

moto answers GetConsoleOutput with a fixed kernel log. On EC2, cloud-init writes the instance's SSH
host key fingerprints to the console between "-----BEGIN SSH HOST KEY FINGERPRINTS-----" and
"-----END SSH HOST KEY FINGERPRINTS-----"; ec2gpu pins the host key against them. This patch (in the
sandbox daemon only) appends that block with the fingerprint of the sshd the sandbox started for
the instance, once it exists, so the real pinning path runs end to end.
"""
from __future__ import annotations

import base64
import time
from pathlib import Path


#: what the instance writes to its console (EC2GPU_CONSOLE there): appended to GetConsoleOutput
CONSOLE_LOG = "console.log"


def fingerprint_of_public_key(line: str) -> str:
    """'ssh-ed25519 AAAA... comment' -> 'SHA256:...' as ssh-keygen -l prints it (paramiko computes it)."""
    import paramiko
    key_type, blob = line.split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(blob)).fingerprint


def cloud_init_block(public_key_file: Path, instance_id: str) -> str:
    """The fingerprint block cloud-init prints, for one ed25519 host key."""
    fp = fingerprint_of_public_key(public_key_file.read_text())
    return ("ec2: \n-----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"ec2: 256 {fp} root@{instance_id} (ED25519)\n"
            "-----END SSH HOST KEY FINGERPRINTS-----\n")


def install(instances_dir: Path, delay_s: float = 0.0) -> None:
    """Patch moto's GetConsoleOutput (call in the daemon after importing moto).

    The fingerprints appear ``delay_s`` seconds after the instance's host key was made (its sshd
    started): on EC2 cloud-init prints them in its final stage, after sshd already answers.
    """
    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.responses import general
    from moto.ec2.utils import Base64EncodedString

    def get_console_output(self) -> ActionResult:
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = general.SAMPLE_CONSOLE_OUTPUT
        pub = instances_dir / instance.id / "ssh_host_ed25519_key.pub"
        if pub.exists() and time.time() - pub.stat().st_mtime >= delay_s:
            text += cloud_init_block(pub, instance.id)
        written = instances_dir / instance.id / CONSOLE_LOG
        if written.is_file():
            text += written.read_text(errors="replace")[-32768:]
        return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(),
                             "Output": Base64EncodedString.from_raw_string(text)})

    general.General.get_console_output = get_console_output
