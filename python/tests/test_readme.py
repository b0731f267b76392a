"""The README's Python snippet, run as written (from a directory where `models/` is the
repository's), so the README cannot drift from the package."""
import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_snippet():
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Python\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's Python section has no ```python block"
    return match.group(1)


def test_the_readme_snippet_compiles_runs_and_matches(tmp_path, capsys):
    (tmp_path / "models").symlink_to(ROOT / "models")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(readme_snippet(), "README.md", "exec"), {})
    finally:
        os.chdir(here)
    printed = capsys.readouterr().out
    assert "last_hidden_state (1, 37," in printed
    assert "max relative error" in printed
