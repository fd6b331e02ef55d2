"""The documentation site (issue 48 item 17): docs/ builds with MkDocs in strict mode, so a link to a
missing page or a missing heading fails here, and the README's links lead to files that exist."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_with_no_broken_link_or_heading(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "tasks" / "index.html").is_file()


def test_a_broken_anchor_fails_the_strict_build(tmp_path):
    """The check above can fail: the same build over a copy of docs/ with one link to a heading that
    is not there exits non-zero and names it."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](tasks.md#no-such-heading)\n")
    config = (ROOT / "mkdocs.yml").read_text()
    (tmp_path / "mkdocs.yml").write_text(config)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr


def test_every_relative_link_of_the_readme_leads_to_a_file_that_exists():
    readme = (ROOT / "README.md").read_text()
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)]+)\)", readme) if not t.startswith(("http", "#"))]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing
