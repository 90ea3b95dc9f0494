"""Installs come from the lock, and the lock is pyproject.toml's (`make lock`).

pyproject.toml says what TaskForge depends on; uv.lock is one resolution of it for every
platform and Python with each file's hash; requirements/*.txt are the lock exported for
plain pip (`make run`, `make test`, `make bench`, deploy/build.sh).  These tests fail as
soon as the three disagree: a dependency added to pyproject.toml without `make lock`, or
an export edited by hand or left behind after the lock moved.

The first two read the files alone (no uv needed); the last asks uv itself, offline, where
`make lock` has installed it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())
HEADER = "# Exported from uv.lock by make lock; do not edit."

# Each exported file and the options of `uv export` that make it (the Makefile's `lock`).
EXPORTS: dict[str, list[str]] = {
    "dev": ["--group=build", "--extra=local", "--extra=test", "--extra=tracing"],
    "bench": ["--group=build", "--extra=local", "--extra=test", "--extra=tracing", "--extra=bench"],
    "service": ["--group=build"],
    "uv": ["--only-group=lock"],
}


# The options every export shares.
EXPORT_OPTIONS = ["--no-emit-project", "--no-header", "--no-default-groups"]


@dataclass(frozen=True)
class Selection:
    """What an export holds: the project's dependencies (unless `only`), its extras and
    dependency groups."""

    extras: tuple[str, ...]
    groups: tuple[str, ...]
    only: bool


def selection(export: str) -> Selection:
    options = [option.split("=", 1) for option in EXPORTS[export]]
    return Selection(
        extras=tuple(value for flag, value in options if flag == "--extra"),
        groups=tuple(value for flag, value in options if flag in ("--group", "--only-group")),
        only=any(flag == "--only-group" for flag, _ in options),
    )


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset[str]


def read_export(name: str) -> tuple[list[str], dict[str, Pin]]:
    """The header lines and the pins of requirements/NAME.txt."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    pins: dict[str, Pin] = {}
    # One entry: `name==version ; marker \` then its `--hash=sha256:...` lines.
    for entry in re.split(r"\n(?=\S)", text):
        if entry.startswith("#") or not entry.strip():
            continue
        spec = entry.split(";", 1)[0].split("\\", 1)[0].strip()
        package, _, version = spec.partition("==")
        assert version, f"requirements/{name}.txt: {spec!r} is not pinned"
        hashes = frozenset(re.findall(r"--hash=(sha256:[0-9a-f]{64})", entry))
        assert hashes, f"requirements/{name}.txt: {spec} has no hash"
        pins[canonicalize_name(package)] = Pin(canonicalize_name(package), version, hashes)
    return header, pins


def locked_packages() -> dict[str, list[dict[str, Any]]]:
    """uv.lock's packages by name (a name has two entries where the resolution forks)."""
    packages: dict[str, list[dict[str, Any]]] = {}
    for package in LOCK["package"]:
        packages.setdefault(canonicalize_name(package["name"]), []).append(package)
    return packages


def root_package() -> dict[str, Any]:
    (root,) = locked_packages()[canonicalize_name(PYPROJECT["project"]["name"])]
    return root


def file_hashes(package: dict[str, Any]) -> frozenset[str]:
    files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
    return frozenset(file["hash"] for file in files)


def needed(wanted: Selection) -> set[str]:
    """Every package the lock installs for `wanted` (on some platform: markers are not
    evaluated, as uv's export keeps them)."""
    packages = locked_packages()
    root = root_package()
    todo: list[dict[str, Any]] = [
        *([] if wanted.only else root.get("dependencies", [])),
        *(dep for extra in wanted.extras for dep in root["optional-dependencies"][extra]),
        *(dep for group in wanted.groups for dep in root["dev-dependencies"][group]),
    ]
    seen: set[str] = set()
    while todo:
        dep = todo.pop()
        name = canonicalize_name(dep["name"])
        for package in packages[name]:
            if "version" in dep and package["version"] != dep["version"]:
                continue
            todo.extend(package.get("dependencies", []) if name not in seen else [])
            for extra in dep.get("extra", []):
                todo.extend(package.get("optional-dependencies", {}).get(extra, []))
        seen.add(name)
    return seen


def declared(wanted: Selection) -> list[Requirement]:
    """pyproject.toml's requirements for `wanted`, as written there."""
    project = PYPROJECT["project"]
    groups = PYPROJECT["dependency-groups"]
    lines = [
        *([] if wanted.only else project["dependencies"]),
        *(line for extra in wanted.extras for line in project["optional-dependencies"][extra]),
        *(line for group in wanted.groups for line in groups[group]),
    ]
    return [Requirement(line) for line in lines]


def _key(name: str, extras: Any, specifier: str, marker: str | None) -> tuple[Any, ...]:
    return (canonicalize_name(name), frozenset(extras), SpecifierSet(specifier), marker)


def test_lock__was_resolved_from_pyproject_toml_as_it_is() -> None:
    """uv.lock records the requirements it resolved; they are pyproject.toml's today."""
    wanted = set()
    for req in declared(Selection((), (), only=False)):
        wanted.add(_key(req.name, req.extras, str(req.specifier), None))
    for extra, lines in PYPROJECT["project"]["optional-dependencies"].items():
        for req in map(Requirement, lines):
            assert req.marker is None, "a marker with an extra: extend this test"
            wanted.add(_key(req.name, req.extras, str(req.specifier), f"extra == '{extra}'"))
    metadata = root_package()["metadata"]
    recorded = {
        _key(dep["name"], dep.get("extras", ()), dep.get("specifier", ""), dep.get("marker"))
        for dep in metadata["requires-dist"]
    }
    stale = "uv.lock is not pyproject.toml's: run `make lock`"
    assert recorded == wanted, f"{stale}\nonly in pyproject: {wanted - recorded}\n" + (
        f"only in uv.lock: {recorded - wanted}"
    )
    assert set(metadata["provides-extras"]) == set(PYPROJECT["project"]["optional-dependencies"])
    groups = {
        group: {
            _key(req.name, req.extras, str(req.specifier), None) for req in map(Requirement, lines)
        }
        for group, lines in PYPROJECT["dependency-groups"].items()
    }
    recorded_groups = {
        group: {
            _key(dep["name"], dep.get("extras", ()), dep.get("specifier", ""), None) for dep in deps
        }
        for group, deps in metadata.get("requires-dev", {}).items()
    }
    assert recorded_groups == groups, stale


@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_requirements__are_the_lock_exported(export: str) -> None:
    """requirements/NAME.txt pins exactly the packages the lock resolves for its extras, at
    the lock's versions with the lock's hashes; each of pyproject.toml's requirements is
    there and satisfied."""
    wanted = selection(export)
    header, pins = read_export(export)
    assert header[:1] == [HEADER], f"requirements/{export}.txt: not made by `make lock`"
    packages = locked_packages()
    for pin in pins.values():
        versions = {package["version"]: package for package in packages.get(pin.name, [])}
        assert pin.version in versions, f"{export}: {pin.name}=={pin.version} is not locked"
        assert pin.hashes == file_hashes(versions[pin.version]), f"{export}: {pin.name} hashes"
    expected = needed(wanted) - {canonicalize_name(PYPROJECT["project"]["name"])}
    assert set(pins) == expected, (
        f"requirements/{export}.txt is not uv.lock's export: run `make lock`\n"
        f"missing: {sorted(expected - set(pins))}\nextra: {sorted(set(pins) - expected)}"
    )
    for req in declared(wanted):
        found = pins.get(canonicalize_name(req.name))
        assert found is not None, f"{export}: pyproject.toml's {req} is not exported"
        assert req.specifier.contains(found.version, prereleases=True), (
            f"{export}: {found.name}=={found.version} does not satisfy pyproject.toml's {req}"
        )


def uv_binary() -> str | None:
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


@pytest.mark.skipif(uv_binary() is None, reason="uv is not installed (make lock installs it)")
def test_lock__is_current_and_exported_by_uv() -> None:
    """uv itself (offline) finds the lock current and exports exactly the committed files."""
    uv = uv_binary()
    assert uv is not None
    check = subprocess.run(
        [uv, "lock", "--check", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, f"run `make lock`:\n{check.stderr}"
    for export, options in EXPORTS.items():
        done = subprocess.run(
            [uv, "export", "--frozen", "--offline", *EXPORT_OPTIONS, *options],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        committed = (ROOT / "requirements" / f"{export}.txt").read_text()
        assert committed == f"{HEADER}\n{done.stdout}", f"requirements/{export}.txt: make lock"
