"""Package discovery for the mapped folders: each top-level part installs as `leveret.<part>`.

pyproject.toml holds everything else. The list of subpackages is found, never written by hand,
so a new subpackage (such as `broker/session`) cannot be left out of the wheel.
"""

from setuptools import find_packages, setup

PARTS = ["amqp", "storage", "broker", "cli", "spark"]

packages = [
    f"leveret.{part}{'.' + sub if sub else ''}"
    for part in PARTS
    for sub in ["", *find_packages(part)]
]

setup(packages=packages, package_dir={f"leveret.{part}": part for part in PARTS})
