"""constraints.txt pins every requirement pyproject.toml names (issue 26 item 11).

It went stale once: regenerated from an old editable install's metadata, it lacked redis and playwright,
so CI installed whatever was newest for them. Each dependency and each extra's requirement must have a
pin that satisfies pyproject's floor, and what is installed here must be what is pinned (CI installs
with ``-c constraints.txt``, so a mismatch means the file was not regenerated after a change).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for requirements in project.get("optional-dependencies", {}).values():
        lines += requirements
    return [Requirement(line) for line in lines]


def pins() -> dict[str, str]:
    pinned: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a pin (name==version)"
            pinned[canonical(name)] = version
    return pinned


@pytest.mark.parametrize("requirement", declared(), ids=str)
def test_every_declared_requirement_has_a_pin_within_its_floor(requirement: Requirement) -> None:
    pinned = pins().get(canonical(requirement.name))
    assert pinned is not None, f"{requirement.name} is in pyproject.toml but not pinned in constraints.txt"
    assert requirement.specifier.contains(pinned, prereleases=True), (
        f"{requirement.name}=={pinned} vs {requirement}"
    )


@pytest.mark.parametrize("requirement", declared(), ids=str)
def test_what_is_installed_is_what_is_pinned(requirement: Requirement) -> None:
    try:
        installed = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{requirement.name} is not installed here")
    assert pins().get(canonical(requirement.name)) == installed, (
        f"{requirement.name} {installed} is installed: regenerate constraints.txt (scripts/constraints.py)"
    )
