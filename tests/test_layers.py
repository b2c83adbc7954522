"""The layers of DESIGN.md, as import-linter contracts (pyproject.toml, [tool.importlinter]):
web and entry points -> domain -> backends -> models -> runners; runners and the CLI import
nothing of the server; the domain, pages, admin, commands, tasks and project reach a backend
only through jobs.backends; no backend imports another; no import circle inside jobs/. Each
contract is shown to fail when a forbidden import is added to a copy of the tree."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("jobs", "runners", "portal", "cli")


def lint(root, *contracts):
    argv = [str(LINT), "--no-cache", *[arg for c in contracts for arg in ("--contract", c)]]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "Contracts: 6 kept, 0 broken." in result.stdout


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the packages and the contracts, to break on purpose."""
    root = tmp_path_factory.mktemp("layers")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.yaml"))
    shutil.copy(ROOT / "pyproject.toml", root)
    return root


@pytest.mark.parametrize("module, line, contract", [
    ("jobs/domain/states.py", "import jobs.tasks", "layers"),                    # the domain queues tasks by name
    ("jobs/backends/local.py", "from jobs.domain import scheduler", "layers"),   # backends never reach up
    ("jobs/models.py", "import jobs.backends.kubernetes.clusters", "layers"),
    ("runners/local.py", "import django.conf", "runners-plain"),
    ("runners/output.py", "import jobs.models", "runners-plain"),
    ("cli/main.py", "import jobs.models", "cli-client"),
    ("jobs/domain/live.py", "import jobs.domain.states", "no-circles"),          # states imports live
    ("jobs/web/usage_views.py", "import jobs.backends.instances", "backends-by-setting"),
    ("jobs/tasks.py", "import tests.modelbackend.models", "backends-by-setting"),  # a test backend's model
    ("jobs/admin.py", "import jobs.backends.instances.models", "backends-by-setting"),  # its admin is its own
    ("jobs/backends/instances/backend.py", "import jobs.backends.kubernetes.clusters", "backends-apart"),
])
def test_a_forbidden_import_breaks_its_contract(tree, module, line, contract):
    assert lint(tree, contract).returncode == 0          # kept before the change...
    path = tree / module
    original = path.read_text()
    try:
        path.write_text(original + f"\n{line}  # added by test_layers\n")
        result = lint(tree, contract)
    finally:
        path.write_text(original)
    assert result.returncode != 0, result.stdout         # ... broken by it
    assert "BROKEN" in result.stdout
