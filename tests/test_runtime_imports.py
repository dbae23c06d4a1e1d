"""Developer tooling stays apart from runtime code (issue 10, step 6): importing every runtime module of
the installed namespace imports nothing of ``s3batch.dev`` (the local stack, sample data, test workers)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import importlib, pkgutil, sys

def walk(package):  # pkgutil.walk_packages would import s3batch.dev itself to look inside
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if info.name == "s3batch.dev":
            continue
        module = importlib.import_module(info.name)
        yield info.name
        if info.ispkg:
            yield from walk(module)

import s3batch
names = list(walk(s3batch))
print(len(names), sorted(m for m in sys.modules if m.startswith("s3batch.dev")))
"""


def test_no_runtime_module_imports_the_dev_tooling() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    count, imported = done.stdout.split(" ", 1)
    assert int(count) > 20  # the walk found the runtime modules (workflows and activities included)
    assert imported.strip() == "[]", imported
