"""The README's two commands, run as a new user would run them."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import sysconfig
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The one-line commands of the README's Quick start code blocks, in order."""
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", quick, re.S)]


def test_readme_has_the_demo_and_the_test_command():
    demo, tests = readme_commands()
    assert demo == "pip install . && dmlopt demo"
    assert tests == 'pip install -e ".[test]" && pytest'


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci


@pytest.mark.slow
def test_readme_demo_command_in_a_fresh_environment(tmp_path):
    """`pip install . && dmlopt demo` in a new venv.  The venv sees this environment's
    site-packages through a .pth file so that pip finds the dependencies installed and
    downloads nothing but the build backend."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    site = next(env_dir.glob("lib/python*/site-packages"))
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bin_dir = env_dir / "bin"
    work = tmp_path / "user"
    work.mkdir()
    command = readme_commands()[0].replace("pip install .", f"pip install -q {ROOT}")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cnn-leaky" in r.stdout and "sam-small" in r.stdout
    written = sorted(p.name for p in (work / "dmlopt-demo").iterdir())
    labels = ["cnn-leaky", "cnn-relu", "sam-small", "sam-small-dynamic"]
    assert written == sorted(f"{m}.{t}.onnx" for m in labels for t in ("dml", "cpu"))
    installed = subprocess.run([str(bin_dir / "python"), "-c", "import dmlopt, sys; print(dmlopt.__file__)"],
                               capture_output=True, text=True, env=env, cwd=work)
    assert str(env_dir) in installed.stdout  # the demo ran from the fresh install, not the checkout
