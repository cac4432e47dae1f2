"""A plain (non-editable) install ships every module and data file, and its CLI runs.

The rest of the suite runs against the editable install, whose import hook maps ``core/``,
``store/``, ``runtime/``, ``workers/``, ``client/``, ``service/`` and ``cli/`` to
``sessionfold.*`` whatever ``pyproject.toml`` lists; a wheel holds only what the packaging
metadata names. So this builds a wheel from a clean copy of the work tree, checks its contents
against the files on disk, installs it into a new virtualenv and runs it from there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"core": "sessionfold/core", "store": "sessionfold/store",
            "runtime": "sessionfold/runtime", "workers": "sessionfold/workers",
            "client": "sessionfold/client",
            "service": "sessionfold/service", "cli": "sessionfold/cli"}
#: Non-Python files a package needs at run time (alembic templates, the bundled example).
DATA_PATTERNS = ("py.typed", "examples/*.json", "**/*.mako", "**/*.ini")
#: What a build reads besides the package folders.
BUILD_FILES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "setup.cfg")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")

pytestmark = pytest.mark.slow


def _expected_files(tree: Path) -> set[str]:
    """Every module and data file of the packages in ``tree``, as wheel paths."""
    expected: set[str] = set()
    for folder, target in PACKAGES.items():
        root = tree / folder
        found = set(root.rglob("*.py"))
        for pattern in DATA_PATTERNS:
            found.update(root.glob(pattern))
        for path in found:
            rel = path.relative_to(root)
            if "__pycache__" not in rel.parts:
                expected.add(f"{target}/{rel.as_posix()}")
    return expected


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean copy of what a build reads (no stale build/ from earlier builds, and a fixed
    snapshot: the work tree may change while the suite runs)."""
    src = tmp_path_factory.mktemp("packaging") / "src"
    for folder in PACKAGES:
        shutil.copytree(REPO / folder, src / folder, ignore=IGNORE)
    for name in BUILD_FILES:
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path) -> Path:
    """The wheel ``pip wheel`` builds from :func:`source`."""
    out = source.parent / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out),
         str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (built,) = out.glob("sessionfold-*.whl")
    return built


def test_the_wheel_holds_every_module_and_data_file(source: Path, wheel: Path) -> None:
    expected = _expected_files(source)
    # The files this project cannot work without, whatever else is on disk.
    assert {"sessionfold/core/messages.py", "sessionfold/cli/main.py",
            "sessionfold/client/connection.py", "sessionfold/runtime/providers/anthropic.py",
            "sessionfold/core/py.typed", "sessionfold/store/py.typed",
            "sessionfold/runtime/py.typed", "sessionfold/workers/py.typed",
            "sessionfold/client/py.typed", "sessionfold/workers/usage_consumer.py",
            "sessionfold/cli/py.typed",
            "sessionfold/cli/examples/ops-incident-acct-8842.json"} <= expected
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {len(missing)} file(s): {missing}"
    assert "sessionfold = sessionfold.cli.main:main" in entry_points


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the wheel installed (``--no-deps``); returns its bin directory.

    Its dependencies come from the test run's own environment through a ``.pth`` line: a venv
    made from a venv's python with ``--system-site-packages`` would see the *base* interpreter's
    site-packages, not this environment's. The editable install's import hook is not loaded
    that way (``.pth`` files of an added path are not processed), so ``sessionfold`` can only be
    the wheel's copy.
    """
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "_sessionfold_test_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return venv / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=env)


def test_the_installed_packages_import_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    code = ("import importlib, sys\n"
            "for name in ('sessionfold.core', 'sessionfold.store', 'sessionfold.runtime',"
            " 'sessionfold.workers', 'sessionfold.client', 'sessionfold.service',"
            " 'sessionfold.cli.main', 'sessionfold.core.messages'):\n"
            "    print(importlib.import_module(name).__file__)\n")
    proc = _run(installed, str(installed / "python"), "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = proc.stdout.split()
    assert len(files) == 8
    venv = installed.parent.resolve()
    for f in files:
        assert Path(f).resolve().is_relative_to(venv), f"{f} is not the wheel's copy"


def test_the_installed_cli_runs_and_folds_the_bundled_example(installed: Path,
                                                             tmp_path: Path) -> None:
    help_proc = _run(installed, str(installed / "sessionfold"), "--help", cwd=tmp_path)
    assert help_proc.returncode == 0, help_proc.stderr
    assert "compact" in help_proc.stdout

    locate = ("from importlib.resources import files\n"
              "print(files('sessionfold.cli') / 'examples' / 'ops-incident-acct-8842.json')")
    example = _run(installed, str(installed / "python"), "-c", locate, cwd=tmp_path)
    assert example.returncode == 0, example.stderr
    path = Path(example.stdout.strip())
    assert path.is_file() and path.resolve().is_relative_to(installed.parent.resolve())

    report = _run(installed, str(installed / "sessionfold"), "compact", str(path), "--report",
                  cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "outcome: folded" in report.stdout
