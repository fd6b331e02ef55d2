"""`ec2gpu scale` treats the nodes it adds as `launch` treats its own (issue 27.10): each one's host
key pinned under its instance id, checked against its console output, before plain `ssh NODE`
can reach it; a node whose key the console does not list is terminated; the ledger's row of the
cluster holds every node at once."""
import json
import re
import shutil
import subprocess

import pytest

from ec2gpu import cli
from ec2gpu.aws import instances as inst_mod
from ec2gpu.runs.settle import ledger
from ec2gpu.runs.recover import reconcile

from test_sandbox_train import leftovers, sandbox_settles  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # no training


def test_scale_pins_each_node_it_adds_and_terminates_one_whose_key_the_console_does_not_list(sandbox_env, capsys):
    home, _ = sandbox_env
    assert cli.main(["launch", "--sandbox", "--nodes", "2", "--name", "pins", "--max-runtime", "30", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)[0]["run_id"]

    def row() -> dict:
        return next(r for r in ledger.runs(home) if r["run_id"] == run_id)
    try:
        assert cli.main(["scale", "pins", "3", "--sandbox", "--json"]) == 0
        shown = capsys.readouterr()
        [new] = json.loads(shown.out)["added"]
        known = home / "known_hosts" / new
        assert known.read_text().split()[0] == new  # pinned under the instance id (HostKeyAlias)
        assert "verified against the console output" in " ".join(shown.err.split())
        # OpenSSH with the config scale wrote and that key only (StrictHostKeyChecking yes): no trust on first use
        config = home / "ssh_config"
        assert f"Host pins-2 {new}" in config.read_text() and f"HostKeyAlias {new}" in config.read_text()
        done = subprocess.run([shutil.which("ssh"), "-F", str(config), "-o", "BatchMode=yes", "pins-2", "echo",
                               "$EC2GPU_SANDBOX_INSTANCE"], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stdout.strip() == new, done.stderr
        assert new in row()["instance_ids"]  # in the ledger now, not at some later command

        with pytest.MonkeyPatch.context() as mp:  # a console that lists another key: someone in the middle
            mp.setattr(inst_mod, "host_key_fingerprints", lambda ec2, iid: ["SHA256:" + "A" * 43])
            assert cli.main(["scale", "pins", "4", "--sandbox"]) == 5
        said = " ".join(capsys.readouterr().err.split())
        assert "not one the instance printed" in said and "did not become usable nodes" in said
        [refused] = re.findall(r"launched (i-[0-9a-f]+);", said)
        running, _, _ = leftovers(home)
        assert len(running) == 3 and refused not in running  # terminated; the cluster is as it was
        assert not (home / "known_hosts" / refused).exists()

        assert cli.main(["scale", "pins", "1", "--sandbox"]) == 0
        capsys.readouterr()
        head = row()["instance_ids"][0]
        ended = {a["instance_id"]: a for a in row()["attempts"] if a["instance_id"] != head}
        assert new in ended and refused in ended  # the refused node ran too: it is billed
        assert all("billed_seconds" in a for a in ended.values())  # billed while EC2 still lists them
        assert f"Host pins-2 {new}" not in config.read_text()
        assert row()["status"] == reconcile.STANDING
    finally:
        assert cli.main(["down", "pins", "--sandbox"]) == 0
    assert leftovers(home) == ([], [], []) and sandbox_settles(home)
