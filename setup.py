"""Package list for the `specpilot` distribution (all other metadata is in pyproject.toml).

The folders engine/ kernels/ zoo/ services/ live at the top level but import as
specpilot.engine, specpilot.kernels, specpilot.zoo and specpilot.services. Every folder below
them that holds an __init__.py is a subpackage and is found here, so a new one needs no edit.
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent

PACKAGE_DIR = {
    "specpilot": "specpilot",
    "specpilot.engine": "engine",
    "specpilot.kernels": "kernels",
    "specpilot.zoo": "zoo",
    "specpilot.services": "services",
}


def packages() -> list[str]:
    found = []
    for name, folder in PACKAGE_DIR.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]
    return found


setup(package_dir=PACKAGE_DIR, packages=packages())
