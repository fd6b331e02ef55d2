"""Which workdir files travel: .gitignore + .ec2gpuignore (added, not replacing), never the secrets."""
import shutil
import subprocess

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.remote import sync


def tree(root):
    for rel, text in {"train.py": "x", "data/big.bin": "x" * 100, "notes.txt": "n", ".env": "K=V", ".env.prod": "K=V",
                      "deploy.pem": "k", "keys/id_ed25519": "k", "conf/key.txt": "-----BEGIN RSA PRIVATE KEY-----\n",
                      "sub/model.py": "m", "sub/out/x.bin": "o", ".git/config": "g"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".gitignore").write_text("data/\nout/\n")
    (root / ".ec2gpuignore").write_text("notes.txt\n")


def test_gitignore_and_ec2gpuignore_add_up_and_secrets_stay(tmp_path):
    tree(tmp_path)
    m = sync.manifest(tmp_path)
    assert m.files == [".ec2gpuignore", ".gitignore", "sub/model.py", "train.py"]
    assert sorted(m.withheld) == [".env", ".env.prod", "conf/key.txt", "deploy.pem", "keys/id_ed25519"]
    assert m.bytes == sum((tmp_path / f).stat().st_size for f in m.files)
    assert "deploy.pem" in sync.manifest(tmp_path, allow_secrets=True).files


@pytest.mark.skipif(not shutil.which("git"), reason="git not installed")
def test_inside_a_git_repository_git_decides_then_ec2gpuignore_adds(tmp_path):
    tree(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "sub" / ".gitignore").write_text("model.py\n")  # a nested .gitignore: git honours it
    m = sync.manifest(tmp_path)
    assert m.files == [".ec2gpuignore", ".gitignore", "sub/.gitignore", "train.py"]
    assert ".git/config" not in m.files + m.withheld


def test_a_workdir_above_max_upload_is_refused_with_its_largest_files_and_their_sizes(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 2000)
    (tmp_path / "b.bin").write_bytes(b"x" * 1_500_000)
    (tmp_path / "c.txt").write_bytes(b"x" * 10)
    (tmp_path / "d.txt").write_bytes(b"x" * 5)
    with pytest.raises(UsageError, match=r"a\.bin") as exc:
        sync.check_size(sync.manifest(tmp_path), max_bytes=1000)
    assert "--max-upload" in exc.value.message + exc.value.hint
    assert "(largest: b.bin 1.5 MB, a.bin 2.0 kB, c.txt 10 bytes)" in exc.value.message  # the three largest, sized
    assert [sync.size_words(n) for n in (999, 1000, 52_000_000, 1_200_000_000)] == \
        ["999 bytes", "1.0 kB", "52.0 MB", "1.20 GB"]


@pytest.mark.parametrize("repo", [False, True])
def test_what_ec2gpu_brought_home_earlier_never_goes_up_again_and_a_projects_own_runs_do(tmp_path, repo):
    (tmp_path / "train.py").write_text("x")
    for rel in ("runs/20261122-203042-100a/run.json", "runs/20261122-203042-100a/outputs/model.pt",
                "runs/sweep.yaml", "runs/2026-ablation/notes.md", "sub/runs/20261122-203042-100a/x"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("r")
    if repo:
        if not shutil.which("git"):
            pytest.skip("git not installed")
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    m = sync.manifest(tmp_path)
    assert m.files == ["runs/2026-ablation/notes.md", "runs/sweep.yaml", "sub/runs/20261122-203042-100a/x", "train.py"]


CREDENTIALS = [".netrc", "_netrc", ".git-credentials", ".kube/config", ".docker/config.json",
               ".config/gcloud/configurations/config_default", "gcloud/application_default_credentials.json",
               "gcloud/credentials.db", "gcloud/access_tokens.db", ".pypirc", ".pgpass", ".npmrc", ".bash_history",
               ".zsh_history", ".python_history", ".psql_history", ".mysql_history", ".lesshst", ".viminfo",
               ".local/share/keyrings/login.keyring", "work.keyring", ".password-store/aws.gpg",
               "chrome/Default/Cookies", "chrome/Default/Login Data", "firefox/p.default/cookies.sqlite",
               "firefox/p.default/logins.json", "firefox/p.default/key4.db", ".gnupg/private-keys-v1.d/k.key",
               ".gnupg/pubring.kbx", ".azure/msal_token_cache.json", ".terraform.d/credentials.tfrc.json", ".vault-token",
               ".config/gh/hosts.yml", ".s3cfg", ".boto",
               ".databrickscfg", "vault.kdbx", ".htpasswd", ".ssh/known_hosts", ".aws/credentials", "keys/pgp.asc",
               "keys/putty.txt", "keys/bagged.txt", "web/.yarnrc.yml",
               # issue 44.7: each checked where its tool keeps it
               ".cache/huggingface/token", ".cache/huggingface/stored_tokens", ".huggingface/token",
               ".config/rclone/rclone.conf", ".cargo/credentials.toml", ".cargo/credentials", ".config/hub",
               ".m2/settings.xml", ".m2/settings-security.xml"]


def test_a_hugging_face_token_under_a_custom_hf_home_is_withheld_by_its_content(tmp_path):
    """Review of issue 44 (round 3): the patterns matched only .../huggingface/token, so a custom
    HF_HOME inside the workdir (./.hf/token) was sent. Now a file named `token` that starts with a
    Hugging Face token, or `stored_tokens` with an `hf_token = ...` line, is withheld wherever it is;
    a file of those names without one (a project's own) still goes."""
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
    (tmp_path / ".hf").mkdir()
    (tmp_path / ".hf" / "token").write_text(token)
    (tmp_path / ".hf" / "stored_tokens").write_text(f"[work]\nhf_token = {token}\n\n[oauth]\nhf_token = hf_oauth_{token[3:]}\n")
    (tmp_path / "auth").mkdir()
    (tmp_path / "auth" / "token").write_text("hf_oauth_" + token[3:] + "\n")
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "token").write_text("<unk> <s> </s>\n")  # a project's own file of that name
    (tmp_path / "vocab" / "stored_tokens").write_text("[tokenizer]\nsize = 32000\n")
    m = sync.manifest(tmp_path)
    assert sorted(m.withheld) == [".hf/stored_tokens", ".hf/token", "auth/token"]
    assert m.files == ["vocab/stored_tokens", "vocab/token"]
    assert sync.withheld(tmp_path / ".hf" / "token") and not sync.withheld(tmp_path / "vocab" / "token")


@pytest.mark.parametrize("under", ["", "home/user/"])
def test_the_ecosystems_credential_files_are_withheld_wherever_they_are_unless_include_secrets(tmp_path, under):
    """A workdir holding a home directory's credentials (a task file's `workdir: ../..` before it was refused)."""
    for rel in CREDENTIALS + ["train.py", "web/package.json", "site/.yarnrc.yml", "loss_history.csv"]:
        (tmp_path / under / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / under / rel).write_text("secret")
    (tmp_path / under / "keys/pgp.asc").write_text("-----BEGIN PGP PRIVATE KEY BLOCK-----\n")
    (tmp_path / under / "keys/putty.txt").write_text("PuTTY-User-Key-File-3: ssh-ed25519\n")
    (tmp_path / under / "keys/bagged.txt").write_text("Bag Attributes\n" + "  x: y\n" * 40
                                                     + "-----BEGIN PRIVATE KEY-----\n")
    (tmp_path / under / "web/.yarnrc.yml").write_text("nodeLinker: node-modules\nnpmAuthToken: abc\n")
    (tmp_path / under / "site/.yarnrc.yml").write_text("nodeLinker: node-modules\n")  # no token: the project's own
    m = sync.manifest(tmp_path)
    assert sorted(m.withheld) == sorted(under + rel for rel in CREDENTIALS)
    assert m.files == [under + f for f in ("loss_history.csv", "site/.yarnrc.yml", "train.py", "web/package.json")]
    assert len(sync.manifest(tmp_path, allow_secrets=True).files) == len(CREDENTIALS) + 4


# --- the private-key sniff (ec2gpu/remote/sync.py _looks_like_private_key) ----------------------
# A file of 64 KiB or less is read for a key header in its first 4096 bytes (a token file: in
# its first 64 KiB); a bigger file is not read. Each test fails when one token of the decision
# changes (a threshold, a comparison): mutants the fast tier let through before (issue 29, item 14).

KIB = 1024
PEM = b"-----BEGIN OPENSSH PRIVATE KEY-----\n"


def _file(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_key_file_of_exactly_64_kib_is_read_and_withheld_one_byte_more_is_not_read(tmp_path):
    """The size limit is 64 KiB inclusive: a PEM key padded to 65,536 bytes is a key; at 65,537
    bytes the file is not read (a dataset that happens to start like a key is not sniffed)."""
    from ec2gpu.remote import sync

    at = _file(tmp_path, "at.txt", PEM + b"x" * (64 * KIB - len(PEM)))
    over = _file(tmp_path, "over.txt", PEM + b"x" * (64 * KIB + 1 - len(PEM)))
    under = _file(tmp_path, "under.txt", PEM + b"x" * (64 * KIB - 1 - len(PEM)))
    assert at.stat().st_size == 64 * KIB and over.stat().st_size == 64 * KIB + 1
    assert sync._looks_like_private_key(at) is True
    assert sync._looks_like_private_key(under) is True
    assert sync._looks_like_private_key(over) is False
    assert sync.withheld(at) and not sync.withheld(over)
    m = sync.manifest(tmp_path)
    assert m.withheld == ["at.txt", "under.txt"] and m.files == ["over.txt"]
    assert sorted(sync.manifest(tmp_path, allow_secrets=True).files) == ["at.txt", "over.txt", "under.txt"]


def test_a_key_header_is_found_in_the_first_4096_bytes_and_not_after(tmp_path):
    """_SNIFF_BYTES: a header that ends at byte 4096 is found, one byte later it is not."""
    from ec2gpu.remote import sync

    header = b"PRIVATE KEY-----"
    inside = _file(tmp_path, "inside.txt", b"#" * (4096 - len(header)) + header + b"\n" * 100)
    after = _file(tmp_path, "after.txt", b"#" * (4097 - len(header)) + header + b"\n" * 100)
    assert sync._looks_like_private_key(inside) is True
    assert sync._looks_like_private_key(after) is False


@pytest.mark.parametrize("header", [b"-----BEGIN RSA PRIVATE KEY-----", b"-----BEGIN PGP PRIVATE KEY BLOCK-----",
                                    b"PuTTY-User-Key-File-3: ssh-ed25519"])
def test_each_key_header_is_a_key_and_a_near_miss_is_not(tmp_path, header):
    from ec2gpu.remote import sync

    assert sync._looks_like_private_key(_file(tmp_path, "k.txt", header + b"\n"))
    assert not sync._looks_like_private_key(_file(tmp_path, "p.txt", b"-----BEGIN PUBLIC KEY-----\n"))


def test_a_token_file_is_read_to_64_kib_not_only_its_first_4096_bytes(tmp_path):
    """.yarnrc.yml: its token line may come late in the file; still found at the 64 KiB edge."""
    from ec2gpu.remote import sync

    late = b"npmAuthToken: abc\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    near_end = _file(tmp_path / "a", ".yarnrc.yml", b"#" * (64 * KIB - len(late)) + late)
    clean = _file(tmp_path / "b", ".yarnrc.yml", b"nodeLinker: node-modules\n" + b"#" * 8000)
    assert near_end.stat().st_size == 64 * KIB
    assert sync._looks_like_private_key(near_end) is True
    assert sync._looks_like_private_key(clean) is False
