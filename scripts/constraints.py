"""Write constraints.txt to stdout: what feishu-progress[dev,lark,cluster,otel] needs, as installed.

Run in an environment where the tests just passed (``pip install -e ".[dev]"`` then ``pytest``), so the pins
are a set known to work; CI and the Dockerfile install with ``-c constraints.txt``. The requirements are
read from pyproject.toml itself, not from the installed package's metadata (which is as old as the last
``pip install -e``: that is how redis and playwright went missing). tests/test_constraints.py checks that
every requirement of pyproject.toml has a pin that satisfies it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

EXTRAS = frozenset({"dev", "lark", "cluster", "otel"})
HEADER = """\
# Versions CI and the image install with (pip install -c constraints.txt ...): the set the tests passed on.
# pyproject.toml keeps the floors (aiohttp >= 3.14.3 is past its published advisories); this file pins.
# Regenerate after an upgrade that passed the tests: python scripts/constraints.py > constraints.txt"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras or {""})


PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def declared() -> list[Requirement]:
    """Every requirement pyproject.toml names: the dependencies and every extra's."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in sorted(project.get("optional-dependencies", {})):
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def closure() -> dict[str, str]:
    pins: dict[str, str] = {}
    stack = [(requirement, EXTRAS) for requirement in declared()]
    while stack:
        requirement, extras = stack.pop()
        name = canonical(requirement.name)
        if name in pins or not wanted(requirement, extras):
            continue
        dist = metadata.distribution(requirement.name)
        pins[name] = dist.version
        needed = frozenset(requirement.extras)
        stack.extend((Requirement(line), needed) for line in dist.requires or [])
    return pins


def main() -> None:
    pins = (f"{name}=={version}" for name, version in sorted(closure().items()))
    sys.stdout.write("\n".join((HEADER, *pins)) + "\n")


if __name__ == "__main__":
    main()
