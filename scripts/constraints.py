"""Write constraints.txt to stdout: the installed feishu-progress[dev,lark,cluster] and all it needs.

Run in an environment where the tests just passed (``pip install -e ".[dev]"`` then ``pytest``), so the pins
are a set known to work; CI and the Dockerfile install with ``-c constraints.txt``.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement

ROOT = "feishu-progress"
EXTRAS = frozenset({"dev", "lark", "cluster"})
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


def closure() -> dict[str, str]:
    pins: dict[str, str] = {}
    stack = [(Requirement(line), EXTRAS) for line in metadata.requires(ROOT) or []]
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
