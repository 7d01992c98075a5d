"""The client stands alone (issue 27: `pip install ./client`): its wheel builds from client/pyproject.toml with
no network, holds the `client` package and the `rlcp` console script, and imports and runs from the wheel alone,
with the repository off the path (so no platform module can be reached). Its settings come from the arguments,
else RLCP_URL / RLCP_TOKEN, else the config file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from client.api import settings_from

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_builds_and_runs_without_the_repository(tmp_path: Path) -> None:
    source = tmp_path / "src" / "client"  # a copy: setuptools writes build/ and *.egg-info beside the sources
    shutil.copytree(REPO / "client", source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    build = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation"]
    built = subprocess.run([*build, "-w", str(tmp_path / "dist"), "-q"], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("rlcp_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "rlcp = client.cli:main" in archive.read(entry_points).decode()
        archive.extractall(tmp_path / "site")
    assert {"client/api.py", "client/cli.py", "client/follow.py", "client/types.py"} <= names
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    ran = subprocess.run(
        [sys.executable, "-c", "import client, client.cli, sys; print(client.__file__); client.cli.main(['--help'])"],
        cwd=tmp_path,  # not the repository: only the wheel's `client` can be imported
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(str(tmp_path / "site")) and "submit" in ran.stdout and "explain" in ran.stdout


def test_settings_come_from_arguments_then_environment_then_the_config_file(tmp_path, monkeypatch) -> None:
    stored = tmp_path / "client.json"
    stored.write_text(json.dumps({"url": "http://file:1/", "token": "from-file"}))
    monkeypatch.setenv("RLCP_CONFIG", str(stored))
    monkeypatch.delenv("RLCP_URL", raising=False)
    monkeypatch.delenv("RLCP_TOKEN", raising=False)
    assert settings_from(None, None) == ("http://file:1", "from-file")
    monkeypatch.setenv("RLCP_URL", "http://env:2")
    monkeypatch.setenv("RLCP_TOKEN", "from-env")
    assert settings_from(None, None) == ("http://env:2", "from-env")
    assert settings_from("http://arg:3/", "from-arg") == ("http://arg:3", "from-arg")
    monkeypatch.delenv("RLCP_TOKEN")
    monkeypatch.setenv("RLCP_CONFIG", str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match="no API token"):
        settings_from(None, None)
