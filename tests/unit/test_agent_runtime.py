"""A detached run's agent's own boto3 (runs/detached/agent_runtime.py, issue 51 item 5): packed from
this machine's, complete, and able to write S3 objects conditionally in a venv that sees nothing of
the image's site-packages."""
import io
import json
import re
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

from ec2gpu.agent import store
from ec2gpu.runs.detached import agent_runtime

AGENT_DIR = Path(store.__file__).parent


def _required(dist: str) -> set[str]:
    """The distributions ``dist`` requires, without extras (its Requires-Dist)."""
    out = set()
    for req in metadata.requires(dist) or []:
        if "extra ==" in req:
            continue
        out.add(re.split(r"[ ;<>=!(\[]", req, maxsplit=1)[0].lower())
    return out


def test_the_bundle_holds_boto3_and_everything_it_requires():
    want, todo = set(), ["boto3"]
    while todo:
        dist = todo.pop()
        if dist not in want:
            want.add(dist)
            todo.extend(_required(dist))
    assert want == set(agent_runtime.MODULES.values())
    names = zipfile.ZipFile(io.BytesIO(agent_runtime.bundle())).namelist()
    tops = {n.split("/")[0].removesuffix(".py") for n in names}
    assert tops == set(agent_runtime.MODULES)
    assert not [n for n in names if n.endswith((".pyc", ".so")) or "__pycache__" in n]  # pure Python, any CPython


def test_the_models_packed_are_those_of_every_service_the_agent_calls():
    """botocore's models of other services are left out (~30 MB): a client the agent makes of a
    service not in SERVICES would fail on the instance, so every one it makes is listed."""
    called = set()
    for path in AGENT_DIR.glob("*.py"):
        called |= set(re.findall(r"""client\(\s*["']([a-z0-9-]+)["']""", path.read_text()))
    assert called and called <= set(agent_runtime.SERVICES)
    names = zipfile.ZipFile(io.BytesIO(agent_runtime.bundle())).namelist()
    models = {n.split("/")[2] for n in names if n.startswith("botocore/data/") and n.count("/") > 2}
    assert models == set(agent_runtime.SERVICES)


def test_the_same_installed_files_make_the_same_bytes():
    first = agent_runtime.bundle()
    agent_runtime.bundle.cache_clear()
    assert agent_runtime.bundle() == first  # one sha256 in the user data for one install


def test_the_agents_own_boto3_writes_conditionally_in_a_venv_of_its_own(tmp_path):
    """The boot script's steps (launch.boot_script): a venv without pip, the zip unpacked into its
    site-packages; its Python, run as the agent is (-E -s), imports that boto3, not this machine's,
    makes a client of each service and finds PutObject's IfMatch and IfNoneMatch, which the image's
    may lack (agent/store.MIN_CONDITIONAL_BOTOCORE)."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False, clear=True)
    python = env / "bin" / "python3"
    site = subprocess.run([python, "-E", "-s", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    zipfile.ZipFile(io.BytesIO(agent_runtime.bundle())).extractall(site)
    probe = ("import json, boto3, botocore\n"
             "kw = dict(region_name='us-east-1', aws_access_key_id='x', aws_secret_access_key='y')\n"
             "shapes = {s: boto3.client(s, **kw).meta.service_model.operation_names[:1] for s in "
             f"{list(agent_runtime.SERVICES)!r}}}\n"
             "put = boto3.client('s3', **kw).meta.service_model.operation_model('PutObject').input_shape.members\n"
             "print(json.dumps({'boto3': boto3.__file__, 'botocore': botocore.__version__, 'shapes': shapes,\n"
             "                  'conditional': 'IfMatch' in put and 'IfNoneMatch' in put}))\n")
    got = subprocess.run([python, "-E", "-s", "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(sys.prefix))})
    assert got.returncode == 0, got.stderr
    said = json.loads(got.stdout)
    assert Path(said["boto3"]).is_relative_to(site) and said["conditional"]
    assert all(said["shapes"].values())
    version = tuple(int(x) for x in said["botocore"].split(".")[:3])
    assert version >= tuple(int(x) for x in store.MIN_CONDITIONAL_BOTOCORE.split("."))
