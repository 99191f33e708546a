"""The project as a wheel, outside the source tree (what the images install): the package-dir mapping
puts every import name in the wheel, and `nibble run` works from a directory that holds no source."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.services import run_launcher

ROOT = Path(__file__).resolve().parents[2]
IMPORT_NAMES = ("nibble", "nibble.kernels", "nibble.sampler", "nibble.trainer", "nibble.weightsync", "nibble.wire")


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """A fresh venv holding only the built wheel; the dependencies come from this interpreter's
    site-packages through a .pth line (appended to sys.path without running that directory's .pth
    files, so the editable install's finder, which maps nibble onto the source tree, stays out)."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("nibble-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return wheel, venv


def test_the_wheel_holds_every_import_name_and_its_data(wheel_venv):
    wheel, venv = wheel_venv
    names = zipfile.ZipFile(wheel).namelist()
    for package in IMPORT_NAMES:
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
    assert any(n.startswith("nibble/simulator/web/") and n.endswith(".js") for n in names)
    assert not any(n.startswith(("tests/", "kernels/", "services/")) for n in names)
    where = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            f"import importlib; print([importlib.import_module(n).__file__ for n in {IMPORT_NAMES!r}])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=venv,
        check=True,
    ).stdout
    assert str(ROOT) not in where and where.count(str(venv)) == len(IMPORT_NAMES)


def test_nibble_run_from_the_wheel_in_another_directory(wheel_venv, warm_start, tmp_path):
    _, venv = wheel_venv
    env = {**os.environ, "NIBBLE_MODEL__CHECKPOINT": str(warm_start)}
    env.pop("PYTHONPATH", None)
    config = tmp_path / "smoke.yaml"
    config.write_text((ROOT / "configs" / "smoke.yaml").read_text())
    # run_launcher: past its timeout the launcher is stopped with Ctrl-Cs, which stop the services it started
    nibble = str(venv / "bin" / "nibble")
    result = run_launcher([nibble, "run", "--config", str(config), "--out", "run"], timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    for log in (tmp_path / "run" / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name
