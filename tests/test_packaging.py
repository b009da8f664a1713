"""Packaging: metadata that is true, a wheel with only the package, an sdist whose tests run."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import prefetch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(prefetch.__file__).resolve().parent
ACCELERATOR_API_2_6 = {
    "current_accelerator",
    "current_device_idx",
    "current_device_index",
    "current_stream",
    "device_count",
    "is_available",
    "set_device_idx",
    "set_device_index",
    "set_stream",
    "synchronize",
}
"""``torch.accelerator`` in torch 2.6, the release the ``torch>=2.6`` floor names."""


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    return parser


def minimum(requirement: str, name: str) -> tuple[int, ...]:
    """Return the version after ``name>=`` in ``requirement`` as a tuple of ints."""
    found = re.search(rf"{re.escape(name)}\s*>=\s*([0-9.]+)", requirement)
    assert found, f"no {name}>= in {requirement!r}"
    return tuple(int(part) for part in found.group(1).split("."))


class TestMetadata:
    """Versions stated in setup.cfg, pyproject.toml and the changelog agree with the code."""

    def test_python_versions_agree(self) -> None:
        """python_requires, the classifiers, ruff's target and mypy's version name one floor."""
        cfg = setup_cfg()
        floor = minimum(cfg["options"]["python_requires"], "")
        assert sys.version_info[:2] >= floor
        classifiers = re.findall(r"Python :: (3\.\d+)", cfg["metadata"]["classifiers"])
        assert classifiers and min(tuple(map(int, c.split("."))) for c in classifiers) == floor
        tools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
        assert tools["ruff"]["target-version"] == "py" + "".join(map(str, floor))
        assert tools["mypy"]["python_version"] == ".".join(map(str, floor))

    def test_torch_floor_covers_the_accelerator_calls(self) -> None:
        """Every torch.accelerator function the package calls exists in the torch floor (2.6)."""
        floor = minimum(setup_cfg()["options"]["install_requires"], "torch")
        assert floor == (2, 6)
        used = set()
        for path in PACKAGE.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "accelerator"
                    and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "torch"
                ):
                    used.add(node.attr)
        assert used, "no torch.accelerator call found: is the floor still needed?"
        assert used <= ACCELERATOR_API_2_6, sorted(used - ACCELERATOR_API_2_6)

    def test_version_is_the_newest_changelog_section(self) -> None:
        """__version__ is the first section of the changelog (no unreleased section above it)."""
        changelog = ROOT / "docs" / "changelog.rst"
        if not changelog.exists():
            pytest.skip("docs/ is not shipped in the sdist")
        lines = changelog.read_text(encoding="utf-8").splitlines()
        sections = [
            lines[i] for i in range(2, len(lines) - 1) if re.fullmatch(r"-{3,}", lines[i + 1])
        ]
        assert sections[0] == prefetch.__version__


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Build the sdist and the wheel once, as a packager would; return their paths."""
    if importlib.util.find_spec("build.__main__") is None:  # not a build/ output folder
        pytest.skip("the build package is not installed (the dist extra)")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist


@pytest.mark.slow
@pytest.mark.timeout(300)
class TestDistributions:
    """python -m build: the wheel holds only prefetch/, the sdist what its tests need."""

    def test_wheel_holds_only_the_package(self, built: tuple[Path, Path]) -> None:
        """Every file of the wheel is under prefetch/ or its dist-info; no benchmarks."""
        wheel, _ = built
        assert wheel.name == f"torch_prefetch-{prefetch.__version__}-py3-none-any.whl"
        names = zipfile.ZipFile(wheel).namelist()
        top = {name.split("/")[0] for name in names}
        assert top == {"prefetch", f"torch_prefetch-{prefetch.__version__}.dist-info"}
        assert "prefetch/py.typed" in names and "prefetch/demo.py" in names
        assert not any("bench" in name for name in names)

    def test_sdist_ships_what_its_tests_import(self, built: tuple[Path, Path]) -> None:
        """conftest, __init__, the helpers, benchmarks/ and the DDP example are in the sdist."""
        _, sdist = built
        base = f"torch_prefetch-{prefetch.__version__}/"
        with tarfile.open(sdist) as archive:
            names = {name.removeprefix(base) for name in archive.getnames()}
        local = {
            path.relative_to(ROOT).as_posix()
            for folder in ("tests", "benchmarks")
            for path in (ROOT / folder).rglob("*.py")
        }
        assert local <= names, sorted(local - names)
        assert {"setup.cfg", "pyproject.toml", "examples/ddp_train.py", "LICENSE"} <= names
        assert "Makefile" not in names
