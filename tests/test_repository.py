"""Repository-wide rules: lint clean, and imports follow the layering of docs/design.md §1."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = str(Path(sys.executable).with_name("ruff"))


def test_ruff_lint_and_format_are_clean():
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([RUFF, *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def imported_modules(folder: Path) -> set[tuple[Path, str]]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update((path, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add((path, node.module))
    return found


def test_kernels_import_nothing_else_of_nibble():
    offending = {
        (str(path.relative_to(ROOT)), module)
        for path, module in imported_modules(ROOT / "kernels")
        if module.startswith("nibble") and not module.startswith("nibble.kernels")
    }
    assert not offending


def test_core_imports_no_service():
    services = ("nibble.sampler", "nibble.trainer", "nibble.weightsync")
    offending = {
        (str(path.relative_to(ROOT)), module)
        for path, module in imported_modules(ROOT / "nibble")
        if module.startswith(services) and "cli" not in path.parts
    }
    assert not offending
