"""The house's plan, checked: what sits at the root, and which way imports point. Layers, top to bottom:
the scripts at the root (train.py, sample.py, ...), then research/ (the study harness) and interop/ (Hugging
Face, the official and nanoGPT checkpoints), then nlq/ (the training machinery), then model.py, which imports
torch alone. A module imports only from layers below its own, or from its own package."""
import ast
import sys

from conftest import ROOT

SCRIPTS = {"model.py", "train.py", "prepare_data.py", "sample.py", "eval.py", "bench.py"}
PACKAGES = ("nlq", "research", "interop")
LAYER = {"model": 0, "nlq": 1, "interop": 2, "research": 2}  # root scripts other than model.py: 3
# where the non-test Python lives, by the folders its line budget is counted in
FOLDERS = {"root": ["*.py"], "nlq/": ["nlq/*.py"], "research/": ["research/*.py"], "interop/": ["interop/*.py"],
           "bench/": ["bench/*.py"], "studies and config": ["studies/*.py", "config/*.py"]}
MAX_MODULE_LINES = 900


def project_modules():
    """{dotted module name: path} of every Python module of nlq's own (the root scripts and the packages)."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for package in PACKAGES:
        found.update({f"{package}.{p.stem}": p for p in (ROOT / package).glob("*.py") if p.stem != "__init__"})
    return found


def imports(path, modules):
    """The project modules a file imports, anywhere in it (functions included): {dotted name}."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in modules}
    return out


def layer(name):
    return LAYER.get(name.split(".")[0], 3)


def test_the_root_holds_what_a_reader_runs_and_reads_first():
    assert {p.name for p in ROOT.glob("*.py")} == SCRIPTS and len(SCRIPTS) <= 7


def test_model_imports_torch_alone():
    """model.py: the standard library and torch, nothing of nlq's and no other package."""
    tree = ast.parse((ROOT / "model.py").read_text())
    top = {(a.name if isinstance(n, ast.Import) else n.module).split(".")[0]
           for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert top - set(sys.stdlib_module_names) == {"torch"}


def test_imports_go_down_only():
    """No module imports one in its own layer or above (but its own package's), so the machinery (nlq/)
    imports neither the interop nor the harness nor a script, and nothing imports train.py."""
    modules = project_modules()
    upward = [(name, other) for name, path in modules.items() for other in imports(path, modules)
              if layer(other) > layer(name) or (layer(other) == layer(name) == 3)
              or (layer(other) == layer(name) and other.split(".")[0] != name.split(".")[0])]
    assert upward == []


def test_no_import_circle():
    modules = project_modules()
    graph = {name: imports(path, modules) for name, path in modules.items()}
    state = {}  # name -> "open" while on the path, "done" after

    def visit(name, path):
        if state.get(name) == "open":
            raise AssertionError(f"import circle: {' -> '.join(path + [name])}")
        if state.get(name) is None:
            state[name] = "open"
            for other in sorted(graph[name]):
                visit(other, path + [name])
            state[name] = "done"
    for name in sorted(graph):
        visit(name, [])


def line_counts():
    """{folder: {path: lines}} of the non-test Python, by FOLDERS."""
    return {folder: {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
                     for pattern in patterns for p in sorted(ROOT.glob(pattern))}
            for folder, patterns in FOLDERS.items()}


def test_line_counts_and_no_module_over_the_limit():
    """Minimal, measured: non-test Python lines per folder and in all (python tests/test_house.py prints them),
    every such file in a counted folder, and no module over MAX_MODULE_LINES lines."""
    counts = line_counts()
    print("\n".join(f"{folder:<20}{sum(files.values()):>6,}" for folder, files in counts.items()))
    print(f"{'total':<20}{sum(n for files in counts.values() for n in files.values()):>6,}")
    counted = {path for files in counts.values() for path in files}
    python = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")}
    python = {path for path in python if not path.startswith((".", "tests"))}
    assert python - counted == set()
    long = {path: n for files in counts.values() for path, n in files.items() if n > MAX_MODULE_LINES}
    assert long == {}


if __name__ == "__main__":
    test_line_counts_and_no_module_over_the_limit()
