"""The house's floors: `common` (the ground floor) and `search_spaces` import no other package of
csweep; `objectives` and `reports` stand on them and on nothing above; `sweeps` (the commands and
the driver) may use them all. No arrow runs back up, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "search_spaces", "objectives", "reports", "sweeps")
MAY_IMPORT = {
    "common": set(),
    "search_spaces": set(),
    "objectives": {"common", "search_spaces"},
    "reports": {"common", "search_spaces"},
    "sweeps": {"common", "search_spaces", "objectives", "reports"},
}


def imported_packages(path: Path, package: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(package if node.level else (node.module or "").split(".")[0])
    return out & set(PACKAGES)


def test_no_import_runs_back_up_a_floor():
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for other in imported_packages(path, package) - {package} - MAY_IMPORT[package]:
                wrong.append(f"{path.relative_to(ROOT)} imports {other}")
    assert not wrong, "\n".join(wrong)


def test_layout_md_names_every_module():
    """docs/layout.md gives every module its line."""
    text = (ROOT / "docs" / "layout.md").read_text()
    modules = [p.relative_to(ROOT).with_suffix("").as_posix() for package in PACKAGES
               for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py" or p.parent.name == "commands"]
    tools = [p.relative_to(ROOT).as_posix() for folder in ("benchmarks", "scripts") for p in (ROOT / folder).iterdir()
             if p.suffix in (".py", ".sh")]
    missing = [m for m in modules + tools if f"`{m}`" not in text]
    assert not missing, f"docs/layout.md leaves out {missing}"


def test_every_import_of_csweep_resolves_even_inside_functions():
    """The commands import lazily (nothing heavy before the input is checked): an import inside a
    function that names a module or a name that is not there fails only when that command runs.
    Every `from X import Y` of csweep's own packages, at any depth, names what X has."""
    import importlib

    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            here = ".".join(parts[:-1])  # the package a relative import starts from
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom):
                    continue
                name = importlib.util.resolve_name("." * node.level + (node.module or ""), here) if node.level \
                    else node.module
                if name.split(".")[0] not in PACKAGES:
                    continue
                try:
                    module = importlib.import_module(name)
                except ImportError as exc:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {exc}")
                    continue
                for alias in node.names:
                    if alias.name != "*" and not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{name}.{alias.name}")
                        except ImportError:
                            wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {name} has no {alias.name}")
    assert not wrong, "\n".join(wrong)
