"""conf/ sits at the top of the repository; Hydra must find it from an editable install and from a
regular wheel (where it ships as the package `sweeper.conf`)."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cfg_job(cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "sweeper", "+experiment=resnet_batch", "--cfg", "job"],
        cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


def test_installed_package_finds_its_configs_from_another_directory(tmp_path):
    result = _cfg_job(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: resnet18" in result.stdout


def test_regular_wheel_ships_the_configs(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), "-q"],
        check=True, capture_output=True, timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("sweeper-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "sweeper/conf/config.yaml" in names
    assert "sweeper/conf/experiment/resnet_batch.yaml" in names
    # Installing a pure wheel is unpacking it onto sys.path; put it ahead of the editable finder.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import sweeper.conf, os; print(os.path.dirname(sweeper.conf.__file__))"],
        cwd=work, capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )
    assert where.stdout.strip() == str(site / "sweeper" / "conf")
    result = _cfg_job(work, env)
    assert result.returncode == 0, result.stderr
    assert "name: resnet18" in result.stdout
