"""The distributions as a release makes them, for the tests that look inside them or install them.

`built(tmp_path_factory)` runs `python -m build` once per test process: the sdist, then the wheel
built from that sdist, as a release uploads them. It builds from a copy of the sources that git
knows (committed or new, not ignored), never from the working tree, whose stale `build/` or
`*.egg-info` could bring files that no longer exist into the wheel.

`fresh_venv(path, wheel, extras)` installs the wheel and its dependencies into a new virtualenv, at
the versions this environment has (its leg's pins), which pip's cache holds.
"""

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import ROOT

DISTRIBUTION = "django-timeouts"
_built = None


@dataclass(frozen=True)
class Distributions:
    sdist: Path
    wheel: Path

    def wheel_names(self) -> set:
        with zipfile.ZipFile(self.wheel) as archive:
            return set(archive.namelist())

    def sdist_names(self) -> set:
        """The sdist's files, without its top folder (django_timeouts-<version>/)."""
        with tarfile.open(self.sdist) as archive:
            return {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile() and "/" in m.name}


def require_build_tools():
    if importlib.util.find_spec("build") is None:
        message = "python -m build is not installed here: pip install -r requirements/release.txt (bin/test does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def source_files() -> list[str]:
    """The repository's files as a fresh clone plus the new, not yet committed ones would have them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True, timeout=60).stdout.decode()
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file()
                  and not (ROOT / name).is_symlink())


def package_files() -> set:
    """What the wheel must hold of the sources: every file of the package (code, SQL, templates, py.typed)."""
    return {name for name in source_files() if name.startswith("timeouts/") and "__pycache__/" not in name}


def built(tmp_path_factory) -> Distributions:
    global _built
    if _built is None:
        require_build_tools()
        base = tmp_path_factory.mktemp("distributions")
        source, out = base / "source", base / "dist"
        for name in source_files():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
        result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                                capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, f"python -m build failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
        [sdist], [wheel] = out.glob("*.tar.gz"), out.glob("*.whl")
        _built = Distributions(sdist=sdist, wheel=wheel)
    return _built


def _constraints(path: Path) -> Path:
    """This environment's versions (bin/test's pins for the leg) as pip constraints."""
    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() != DISTRIBUTION and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    path.write_text("\n".join(sorted(seen.values())) + "\n")
    return path


def fresh_venv(path: Path, wheel: Path, extras=()) -> Path:
    """A new virtualenv with the wheel (and `extras`) installed; returns its python. The venv has no
    pip of its own: this environment's pip installs into it (pip --python), which saves a copy."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    python = path / "bin" / "python"
    target = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile",
         "--disable-pip-version-check", "-c", str(_constraints(path / "constraints.txt")), target],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"pip install {target} failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
    return python
