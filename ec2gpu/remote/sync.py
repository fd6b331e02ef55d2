"""The workdir up, the outputs home: which files go (ignore rules), and moving them (rsync, else SFTP).

Which files: inside a git repository, ``git ls-files --cached --others --exclude-standard`` (every
.gitignore, .git/info/exclude and the global excludes, as git reads them); elsewhere the
directory's own .gitignore read with pathspec. ``.ec2gpuignore`` (gitignore syntax) is applied on
top, adding to .gitignore, never replacing it. ``.git/``, ``.env*`` and the ecosystem's credential
files wherever they are (NEVER_SEND: keys, ~/.aws, ~/.ssh, .netrc, .git-credentials, .kube/,
.docker/config.json, gcloud's, .pypirc, .pgpass, histories, keyrings, browser cookies, ...), and
files that start like a private key, never go unless ``allow_secrets``; what
ec2gpu brought home on earlier runs (``runs/<run id>/``) never goes.

How: real ``rsync`` over the run's own SSH (an OpenSSH config with the run's key and the host key
pinned, StrictHostKeyChecking yes) when both sides have it, so a rerun sends only what changed;
otherwise one tar archive over SFTP, unpacked on the instance.
"""
from __future__ import annotations

import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import pathspec

from ..errors import RemoteError, UsageError
from . import files

if TYPE_CHECKING:
    from fabric import Connection

IGNORE_FILE = ".ec2gpuignore"
#: never sent unless --include-secrets, wherever they are in the workdir (gitignore syntax):
#: credentials and version-control internals, each group with the documentation that names it
NEVER_SEND = [
    ".git/", ".env", ".env.*",  # git's internals; dotenv files (github.com/motdotla/dotenv)
    # keys: PEM and PKCS#12 files; OpenSSH's key names (ssh-keygen(1), FILES); PuTTY's (.ppk)
    "*.pem", "*.key", "*.p12", "*.pfx", "*.ppk", "id_rsa", "id_dsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519",
    "id_ed25519_sk",
    # credentials directories (also refused as a workdir: tasks/load.CREDENTIAL_DIRS): AWS CLI
    # (docs.aws.amazon.com/cli/latest/userguide/cli-configure-files.html), OpenSSH (ssh(1) FILES),
    # GnuPG (gnupg.org/documentation/manuals/gnupg/GPG-Configuration.html), kubectl
    # (kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/), Azure CLI
    # (learn.microsoft.com/cli/azure/azure-cli-configuration), pass (passwordstore.org), GNOME
    # Keyring (wiki.gnome.org/Projects/GnomeKeyring), gcloud (cloud.google.com/sdk/docs/configurations),
    # GitHub CLI's hosts.yml (cli.github.com/manual/gh_auth_login)
    ".aws/", ".ssh/", ".gnupg/", ".kube/", ".azure/", ".password-store/", "**/.local/share/keyrings/", "*.keyring",
    "**/.config/gcloud/", "**/.config/gh/",
    # gcloud's credential files wherever they are (cloud.google.com/docs/authentication/application-default-credentials)
    "application_default_credentials.json", "credentials.db", "access_tokens.db", "legacy_credentials/",
    # login files: netrc (curl, git, pip: everything.curl.dev/usingcurl/netrc; _netrc on Windows),
    # git-credential-store (git-scm.com/docs/git-credential-store), docker login
    # (docs.docker.com/reference/cli/docker/login/), .pypirc (packaging.python.org/specifications/pypirc/),
    # .pgpass (postgresql.org/docs/current/libpq-pgpass.html), .npmrc (docs.npmjs.com/cli/configuring-npm/npmrc),
    # terraform login (developer.hashicorp.com/terraform/cli/config/config-file#credentials), vault login's
    # token helper (developer.hashicorp.com/vault/docs/commands/token-helper), s3cmd (s3tools.org/kb/item14.htm),
    # boto 2 (boto.cloudhackers.com/en/latest/boto_config_tut.html), Databricks CLI
    # (docs.databricks.com/dev-tools/cli/profiles.html), Apache htpasswd, KeePass databases (*.kdbx)
    ".netrc", "_netrc", ".git-credentials", "**/.docker/config.json", ".pypirc", ".pgpass", ".npmrc", "kaggle.json",
    "credentials.tfrc.json", ".vault-token", ".s3cfg", ".boto", ".databrickscfg", ".htpasswd", "*.kdbx",
    # tokens of ML and developer tools: Hugging Face's login token and its stored tokens in HF_HOME
    # (~/.cache/huggingface; huggingface.co/docs/huggingface_hub/package_reference/environment_variables,
    # HF_TOKEN_PATH and HF_STORED_TOKENS_PATH) and the older ~/.huggingface/token; rclone's remotes
    # (rclone.org/docs/#config-config-file); Cargo's registry tokens (doc.rust-lang.org/cargo/reference/
    # config.html#credentials); hub's OAuth token (hub(1), ~/.config/hub); Maven's server passwords
    # (maven.apache.org/settings.html#servers, maven.apache.org/guides/mini/guide-encryption.html)
    "**/huggingface/token", "**/huggingface/stored_tokens", "**/.huggingface/token", "rclone.conf",
    "**/.cargo/credentials", "**/.cargo/credentials.toml", "**/.config/hub", "**/.m2/settings.xml",
    "**/.m2/settings-security.xml",
    # shell and REPL histories (commands typed with tokens in them): bash(1) HISTFILE, zsh's
    # .zsh_history/.zhistory/.histfile, Python's .python_history, psql, mysql, node, fish's
    # fish_history, less(1) LESSHISTFILE, vim's viminfo
    ".*_history", ".zhistory", ".histfile", "fish_history", ".lesshst", ".viminfo",
    # browser cookie and password stores: Chrome/Chromium profiles (Cookies, Login Data, Web Data;
    # chromium.org/developers/design-documents/user-data-directory), Firefox profiles (cookies.sqlite,
    # logins.json, key4.db; support.mozilla.org/kb/profiles-where-firefox-stores-user-data)
    "Cookies", "Cookies-journal", "Login Data", "Login Data-journal", "Web Data", "cookies.sqlite", "logins.json",
    "key3.db", "key4.db",
]
#: a small file starting with one of these (in its first _SNIFF_BYTES) is a private key: PEM
#: (RFC 7468: "-----BEGIN ... PRIVATE KEY-----", OpenSSH's too), OpenPGP (RFC 4880 armor), PuTTY
_KEY_HEADERS = (b"PRIVATE KEY-----", b"PRIVATE KEY BLOCK-----", b"PuTTY-User-Key-File-")
#: files whose token lines make them secret (Yarn Berry's .yarnrc.yml: yarnpkg.com/configuration/yarnrc);
#: without one the project's own settings still go
_TOKEN_FILES = {".yarnrc.yml": (b"npmAuthToken", b"npmAuthIdent", b"npmPassword")}
#: files whose content is a Hugging Face token, wherever HF_HOME or HF_TOKEN_PATH put them (./.hf/token
#: escapes the patterns above): ``token`` starts with the token itself, ``stored_tokens`` is an INI file
#: with an ``hf_token = ...`` line per stored token (huggingface_hub's _login._save_stored_tokens). A
#: token is ``hf_`` and letters or digits (``hf_oauth_...`` for an OAuth one)
_HF_TOKEN = rb"hf_[A-Za-z0-9_]{20,}"
_TOKEN_CONTENT = {"token": re.compile(rb"\A\s*" + _HF_TOKEN),
                  "stored_tokens": re.compile(rb"(?m)^\s*hf_token\s*=\s*" + _HF_TOKEN)}
_SNIFF_BYTES = 4096
#: never sent: what ec2gpu itself brought home into the workdir on earlier runs (runs/<run id>/, the
#: default artifacts directory when a run starts in the project), matched by the run id's format
#: (runs/provision/pipeline.new_run_id) so a project's own runs/ files still go
OWN_ARTIFACTS = ["/runs/[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]-[0-9][0-9][0-9][0-9][0-9][0-9]-[0-9a-f][0-9a-f]*/"]
MAX_UPLOAD_BYTES = 1 << 30  # --max-upload default: 1 GiB


@dataclass
class Manifest:
    """The files of a workdir that will be sent: relative POSIX paths, their total size in bytes."""

    root: Path
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    withheld: list[str] = field(default_factory=list)  # secrets kept back (NEVER_SEND, key headers)


def _git_files(root: Path) -> list[str] | None:
    if not shutil.which("git"):
        return None
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if done.returncode != 0:
        return None  # not a repository
    return [f for f in done.stdout.decode(errors="surrogateescape").split("\0") if f]


def _walk(root: Path, spec: pathspec.PathSpec[Any]) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirnames[:] = [d for d in dirnames if not spec.match_file(prefix + d + "/")]
        out += [prefix + f for f in filenames if not spec.match_file(prefix + f)]
    return out


def _looks_like_private_key(path: Path) -> bool:
    """Whether the file at ``path`` (64 KiB or less) holds a private key in its first _SNIFF_BYTES
    (_KEY_HEADERS), or is one of _TOKEN_FILES with a token line, or one of _TOKEN_CONTENT holding a
    Hugging Face token. An unreadable file: False."""
    try:
        if path.stat().st_size > 64 * 1024:
            return False
        with open(path, "rb") as f:
            head = f.read(64 * 1024 if path.name in _TOKEN_FILES or path.name in _TOKEN_CONTENT else _SNIFF_BYTES)
    except OSError:
        return False
    token = _TOKEN_CONTENT.get(path.name)
    return any(h in head for h in _KEY_HEADERS + _TOKEN_FILES.get(path.name, ())) or bool(token and token.search(head))


@functools.lru_cache(maxsize=32)
def _ignore_spec(lines: tuple[str, ...]) -> pathspec.GitIgnoreSpec:
    """The compiled GitIgnoreSpec of gitignore-syntax ``lines``, kept by their text: each distinct
    set of rules is compiled once and matched against every file (compiled per file, it cost a
    10,000-file workdir about twice its time). Shared between callers: never modified."""
    return pathspec.GitIgnoreSpec.from_lines(lines)


def manifest(root: Path, allow_secrets: bool = False) -> Manifest:
    """What to send from ``root`` under the rules above (sorted). Symbolic links and anything but
    regular files are left out. Each set of rules (the .gitignore, .ec2gpuignore with OWN_ARTIFACTS,
    NEVER_SEND) is compiled at most once per call (``_ignore_spec``), never once per file."""
    root = Path(root).resolve()
    extra = [line for name in (IGNORE_FILE,) if (root / name).is_file()
             for line in (root / name).read_text().splitlines()]
    files = _git_files(root)
    if files is None:
        rules = (root / ".gitignore").read_text().splitlines() if (root / ".gitignore").is_file() else []
        files = _walk(root, _ignore_spec((*rules, ".git/")))
    ignored = _ignore_spec((*extra, *OWN_ARTIFACTS))
    files = [f for f in files if not ignored.match_file(f)]
    never = _ignore_spec(tuple(NEVER_SEND))
    m = Manifest(root)
    for rel in sorted(set(files)):
        path = root / rel
        if not path.is_file() or path.is_symlink():
            continue
        if not allow_secrets and (never.match_file(rel) or _looks_like_private_key(path)):
            m.withheld.append(rel)
            continue
        m.files.append(rel)
        m.bytes += path.stat().st_size
    return m


def withheld(path: Path) -> bool:
    """Whether the one file at ``path`` is one the rules above never send (NEVER_SEND by its name
    or a directory of its path, or a private key by its first bytes)."""
    path = Path(path)
    never = _ignore_spec(tuple(NEVER_SEND))
    return any(never.match_file("/".join(path.parts[k:])) for k in range(1, len(path.parts))) \
        or _looks_like_private_key(path)


def size_words(n: int) -> str:
    """``n`` bytes for a person (pure, decimal units as the messages around it): "812 bytes",
    "3.4 kB", "52.0 MB", "1.20 GB"."""
    if n < 1000:
        return f"{n:,} bytes"
    for unit, scale, digits in (("kB", 1e3, 1), ("MB", 1e6, 1), ("GB", 1e9, 2)):
        if n < scale * 1000 or unit == "GB":
            return f"{n / scale:,.{digits}f} {unit}"
    return f"{n:,} bytes"  # not reached


def check_size(m: Manifest, max_bytes: int = MAX_UPLOAD_BYTES, what: str | None = None) -> None:
    """Refuse (UsageError) a workdir above ``max_bytes``, naming its largest files with their sizes;
    ``what`` names it in the message (default "the workdir ROOT")."""
    if m.bytes <= max_bytes:
        return
    sizes = {f: (m.root / f).stat().st_size for f in m.files}
    largest = sorted(m.files, key=sizes.__getitem__, reverse=True)[:3]
    raise UsageError(f"{what or f'the workdir {m.root}'} holds {m.bytes / 1e6:,.0f} MB in {len(m.files):,} files, above "
                     f"--max-upload {max_bytes / 1e6:,.0f} MB (largest: "
                     f"{', '.join(f'{f} {size_words(sizes[f])}' for f in largest)})",
                     f"list data and outputs in .gitignore or {IGNORE_FILE} (and fetch data on the instance "
                     "in setup), or raise --max-upload")


#: what a transfer without rsync costs, said with the reason it was not used
WITHOUT_RSYNC = "the whole workdir as one archive each time, not only what changed"


def rsync_missing(conn: Connection) -> str | None:
    """Why rsync cannot move files over ``conn``: "rsync is missing on this machine" or "rsync is
    missing on the instance" (``command -v rsync`` there failed); None when both sides have it."""
    if not shutil.which("rsync"):
        return "rsync is missing on this machine"
    if not conn.run("command -v rsync", hide=True, warn=True, in_stream=False).ok:
        return "rsync is missing on the instance"
    return None


def rsync_available(conn: Connection) -> bool:
    """Whether this machine and the instance both have rsync (``rsync_missing``)."""
    return rsync_missing(conn) is None


def local_rsync() -> tuple[str | None, str | None]:
    """(path, version) of the rsync on this machine's PATH: its path and the version its
    ``--version`` prints first (e.g. "3.2.7"); (None, None) without one, (path, None) when it
    does not answer."""
    path = shutil.which("rsync")
    if path is None:
        return None, None
    try:
        first = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return path, None
    words = first.split()
    return path, (words[words.index("version") + 1] if "version" in words[:-1] else None)


def _rsync(ssh_config: Path, src: str, dst: str, names: list[str], what: str, mode: Sequence[str] = ("-a",)) -> None:
    """rsync exactly ``names`` (relative to ``src``) to ``dst`` over ``ssh -F ssh_config``, with
    ``mode`` as its transfer options (``-a`` up; ``pull`` passes its own)."""
    args = [*mode, "--from0", "--files-from=-", "-e", f"ssh -F {shlex.quote(str(ssh_config))}", src, dst]
    done = subprocess.run(["rsync", *args], input="\0".join(names).encode(), capture_output=True)
    if done.returncode != 0:
        raise RemoteError(f"rsync ({what}) exited {done.returncode}", "its message is shown above",
                          command="rsync " + " ".join(shlex.quote(a) for a in args), exit_status=done.returncode,
                          tail="\n".join(done.stderr.decode(errors="replace").strip().splitlines()[-10:]))


def push(conn: Connection, m: Manifest, remote_dir: str, ssh_config: Path | None, host_alias: str) -> str:
    """Send the manifest's files to ``remote_dir``; return how, in words for the run's log:
    "rsync", or "sftp (WHY: ...)" with the reason rsync was not used (``rsync_missing``, or no
    SSH config for it) and what that costs (WITHOUT_RSYNC).

    rsync runs as ``rsync -a --files-from=- -e 'ssh -F SSH_CONFIG' ROOT/ HOST_ALIAS:REMOTE_DIR/`` (only
    what changed moves); without rsync on either side, one tar.gz over SFTP is unpacked there.
    Raises RemoteError when the transfer fails.
    """
    conn.run(f"mkdir -p {shlex.quote(remote_dir)}", hide=True, in_stream=False)
    why = "no SSH config for rsync" if ssh_config is None else rsync_missing(conn)
    if why is None:
        # why is None only with an ssh_config (the line above)
        _rsync(cast(Path, ssh_config), f"{m.root}/", f"{host_alias}:{remote_dir}/", m.files, "workdir up")
        return "rsync"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in m.files:
            tar.add(m.root / rel, arcname=rel, recursive=False)
    buf.seek(0)
    archive = f"{remote_dir}/.ec2gpu-workdir.tar.gz"
    conn.put(buf, archive)
    conn.run(f"tar -xzf {shlex.quote(archive)} -C {shlex.quote(remote_dir)} && rm -f {shlex.quote(archive)}",
             hide=True, in_stream=False)
    return f"sftp ({why}: {WITHOUT_RSYNC})"


def pull(conn: Connection, remote_dir: str, local_dir: Path, patterns: list[str], ssh_config: Path | None,
         host_alias: str, limits: files.Limits = files.Limits(),
         warn: Callable[[str], None] = lambda line: None) -> tuple[list[str], str]:
    """Bring the regular files under ``remote_dir`` (recursively) home to ``local_dir``: every one,
    or those matching ``patterns`` (gitignore-style globs, relative to ``remote_dir``). Returns
    (names brought home, "rsync" | "sftp" | "none").

    The instance is hostile input (remote/files.py): names are listed over SFTP, checked, and
    written only inside ``local_dir``; at most ``limits`` files and bytes come home; what is
    skipped or left is said through ``warn`` (one line per kind). rsync gets exactly the checked
    names (``--files-from``), with ``-t`` alone: no recursion into what it was not given, no
    symbolic links (``--safe-links`` too), devices, permissions or owners from the instance, and no
    file over the byte limit (``--max-size``). Raises RemoteError when rsync fails, the
    connection's errors as they come.
    """
    local_dir.mkdir(parents=True, exist_ok=True)
    sftp = conn.sftp()
    spec = pathspec.GitIgnoreSpec.from_lines(patterns) if patterns else None
    links: list[str] = []
    sel = files.select(files.listing(sftp, remote_dir, links=links), local_dir, limits,
                       spec.match_file if spec else None)
    for line in sel.warnings(f"{remote_dir}", limits):
        warn(line)
    if links:
        warn(files.links_words(remote_dir, links))
    names = [f.name for f in sel.files]
    if not names:
        return [], "none"
    if ssh_config is not None and rsync_available(conn):
        _rsync(ssh_config, f"{host_alias}:{remote_dir}/", f"{local_dir}/", names, "outputs home",
               ["-t", "--safe-links", f"--max-size={limits.bytes}"])
        return [n for n in names if (local_dir / n).is_file()], "rsync"
    got, budget = [], limits.bytes
    for f in sel.files:  # each read bounded by what is left of the byte limit: a file may grow after its listing
        try:
            budget -= files.get_bounded(sftp, f"{remote_dir}/{f.name}", local_dir / f.name, budget)
        except (FileNotFoundError, files.TooBig) as exc:
            why = "gone" if isinstance(exc, FileNotFoundError) else "it grew past the limit"
            warn(f"{remote_dir}: {f.name!r} not brought home ({why} while being copied)")
            continue
        got.append(f.name)
    return got, "sftp"
