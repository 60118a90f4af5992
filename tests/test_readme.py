"""The README's two commands, run as a new user would run them."""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys
import sysconfig
import venv

import onnx
import pytest

from dmlopt.cli.commands import main
from tests import shape_models

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


def use_it_commands() -> list[str]:
    """The shell lines of the README's "Use it" section, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_examples_on_a_model_with_dynamic_axes(tmp_path, monkeypatch, capsys):
    """Every `dmlopt ...` line of "Use it", as a newcomer runs it on their own model with dynamic
    batch, height and width (a small U-Net stands in for the SAM encoder of the examples)."""
    monkeypatch.chdir(tmp_path)
    onnx.save(shape_models.unet(input_name="input_image"), tmp_path / "sam_vit_b_encoder.onnx")
    commands = use_it_commands()
    assert len(commands) >= 6 and all(c.startswith("dmlopt ") for c in commands)
    for command in commands:
        argv = shlex.split(command)[1:]
        if argv[0] == "bench":
            argv += ["--runs", "3", "--warmup", "1"]
        code = main(argv)
        out, err = capsys.readouterr()
        if argv[0] == "calibrate" and "DirectML" in err:  # Windows only: one line, exit 2
            assert code == 2 and err.count("\n") == 1, err
            continue
        assert code == 0, (command, err)
        assert "Traceback" not in err
        if argv[0] == "validate":
            assert "input_image 1x3x" in out.splitlines()[0] and "numerics: match" in out
        if argv[0] == "bench":
            assert "inputs (same for every model): input_image 1x3x1024x1024" in out
    assert (tmp_path / "sam.dml.onnx").is_file() and (tmp_path / "report.html").is_file()
