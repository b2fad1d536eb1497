"""The house has floors and no circles, over every package of ours (tokenizer, serve, strata_control, strata_cli,
tools), every import counted (deferred ones inside functions too, read with ast):
- each module sits on a floor (FLOORS, bottom to top) and imports only from its own package or from floors
  below it; packages on the same floor are siblings and do not import each other;
- no module imports another module's `_private` name;
- no module imports another that imports it back, directly or through others;
- no test module imports another (shared fixtures live in conftest.py files).
The checker is plain functions over source text, so a test can plant an upward import and watch it fail."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tokenizer", "serve", "strata_control", "strata_cli", "tools")

# Bottom to top. A module's unit is the longest name here that is it or a package above it.
FLOORS = {
    "serve": 0,                     # serve/__init__.py: the map, imports nothing
    "tokenizer": 0,                 # the GGUF's text side: imports nothing of ours
    "serve.core": 1,                # the one internal request, its values, its errors
    "strata_control": 2,            # decisions before anything runs: models, run configs, families
    "serve.ops": 3,                 # figures the server keeps and shows
    "serve.prompt": 3,              # messages -> prompt text
    "serve.engine_client": 3,       # the engine child over docs/PROTOCOL.md
    "serve.generation": 4,          # a prepared request -> events
    "serve.lifecycle": 5,           # which model's Service runs
    "serve.api": 6,                 # one translator per dialect over a neutral wire module
    "serve.http": 7,                # the shell: server, routes, views, guard, access, pacing
    "serve.bootstrap.paths": 8,     # where Strata's files are: engine, models, private cache and logs
    "serve.bootstrap.options": 9,   # the server's options from flags over the run config
    "serve.bootstrap": 10,          # the composition root (serve/bootstrap/__init__.py)
    "strata_cli": 11,               # the `strata` command and its helpers
    "tools": 11,                    # scripts: benchmarks, soak, device checks
}


def modules(root: pathlib.Path = ROOT, packages=PACKAGES) -> dict[str, pathlib.Path]:
    out = {}
    for pkg in packages:
        for path in (root / pkg).rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_in(tree: ast.AST, name: str, is_package: bool, known) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in `tree`, resolved to modules in `known`.
    `from pkg import sub` is an import of `pkg.sub`; `from mod import x` one of `mod` taking `x`."""
    found = []
    pkg = name if is_package else name.rsplit(".", 1)[0]

    def resolve(t):
        while t and t not in known:
            t = t.rsplit(".", 1)[0] if "." in t else ""
        return t

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                t = resolve(a.name)
                if t:
                    found.append((t, []))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            taken = []
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    found.append((f"{base}.{a.name}", []))
                else:
                    taken.append(a.name)
            if taken:
                t = resolve(base)
                if t:
                    found.append((t, taken))
    return [(t, names) for t, names in found if t != name]


def graph(root: pathlib.Path = ROOT, packages=PACKAGES) -> dict[str, list[tuple[str, list[str]]]]:
    mods = modules(root, packages)
    return {name: imports_in(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", mods)
            for name, path in mods.items()}


def unit_of(module: str, floors=FLOORS) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in floors:
            return ".".join(parts[:n])
    return None


def floor_breaks(g, floors=FLOORS) -> list[str]:
    """Every edge that runs up a floor or sideways into a sibling package, and every module with no floor."""
    out = []
    for mod, edges in sorted(g.items()):
        src = unit_of(mod, floors)
        if src is None:
            out.append(f"{mod} has no floor")
            continue
        for target, _ in edges:
            dst = unit_of(target, floors)
            if dst is None or dst == src:
                continue
            if floors[dst] > floors[src]:
                out.append(f"{mod} (floor {floors[src]}) imports {target} (floor {floors[dst]}): up")
            elif floors[dst] == floors[src]:
                out.append(f"{mod} imports {target}: a sibling on floor {floors[src]}")
    return out


def private_imports(g) -> list[str]:
    return [f"{mod} imports {target}.{n}" for mod, edges in sorted(g.items()) for target, names in edges
            for n in names if n.startswith("_") and not n.startswith("__")]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_two_modules_importing_each_other():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_itself_back():
    g = {mod: {t for t, _ in edges} for mod, edges in graph().items()}
    found = cycles(g)
    assert not found, f"import cycles: {found}"


def test_every_import_goes_down_a_floor():
    breaks = floor_breaks(graph())
    assert not breaks, "imports against the floors:\n" + "\n".join(breaks)


def test_no_module_imports_another_modules_private_name():
    found = private_imports(graph())
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def _plant(root: pathlib.Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_fails_on_a_planted_upward_import(tmp_path):
    """A tree of our shape where serve.core reaches up into serve.http from inside a function, a sibling
    reaches sideways, and a translator takes another's private: each is reported; the clean edges are not."""
    _plant(tmp_path, {
        "serve/__init__.py": "",
        "serve/core/__init__.py": "",
        "serve/core/events.py": "def late():\n    from serve.http import server\n    return server\n",
        "serve/http/__init__.py": "",
        "serve/http/server.py": "from serve.core import events\nfrom serve.api.openai import parse\n",
        "serve/api/__init__.py": "",
        "serve/api/openai.py": "from serve.core.events import late\n\n\ndef parse():\n    pass\n\n\ndef _hidden():\n"
                               "    pass\n",
        "serve/api/anthropic.py": "from serve.api.openai import _hidden\n",
        "serve/ops/__init__.py": "",
        "serve/ops/views.py": "import serve.prompt.chatml\n",
        "serve/prompt/__init__.py": "",
        "serve/prompt/chatml.py": "",
    })
    g = graph(tmp_path, ("serve",))
    breaks = floor_breaks(g)
    assert breaks == ["serve.core.events (floor 1) imports serve.http.server (floor 7): up",
                      "serve.ops.views imports serve.prompt.chatml: a sibling on floor 3"]
    assert private_imports(g) == ["serve.api.anthropic imports serve.api.openai._hidden"]
    g2 = {mod: {t for t, _ in edges} for mod, edges in g.items()}
    assert cycles(g2) == [["serve.api.openai", "serve.core.events", "serve.http.server"]]


def test_a_module_outside_every_floor_is_reported(tmp_path):
    _plant(tmp_path, {"serve/__init__.py": "", "serve/stray.py": ""})
    assert floor_breaks(graph(tmp_path, ("serve",)), {"serve.core": 1}) == ["serve has no floor",
                                                                           "serve.stray has no floor"]


def test_the_http_layer_sees_neither_the_command_line_nor_the_engine_client():
    """A special case of the floors, kept by name: the shell and the translators never reach the pipes."""
    g = graph()
    for mod in [m for m in g if m.startswith(("serve.http", "serve.api"))]:
        bad = {t for t, _ in g[mod] if t.startswith(("strata_cli", "serve.engine_client"))}
        assert not bad, f"{mod} imports {sorted(bad)}"


def imported_test_modules(tree: ast.AST) -> list[str]:
    """The test modules (`test_*`) an AST imports: `from tests.x.test_y import ...`, `import tests.x.test_y`."""
    found = []
    for node in ast.walk(tree):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        if isinstance(node, ast.ImportFrom):
            names += [f"{node.module}.{a.name}" for a in node.names]
        found += [n for n in names if n.startswith("tests.") and n.split(".")[-1].startswith("test_")]
    return found




def test_no_test_module_imports_another():
    """Shared fixtures and helpers live in conftest.py files (or the helper modules beside them), so a test
    file moves without breaking another."""
    bad = {}
    for path in (ROOT / "tests").rglob("*.py"):
        hits = imported_test_modules(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    assert not bad, f"test modules imported by others: {bad}"
    planted = ast.parse("from tests.serve.test_batch import q\nimport tests.engine.test_x as t\n")
    assert imported_test_modules(planted) == ["tests.serve.test_batch", "tests.engine.test_x"]


def test_the_serve_top_level_holds_only_packages():
    """serve/ is its map (__init__.py), its packages (one per floor) and the web app's static/ folder: a new
    module goes into the package of its concern, so the floors table keeps covering it."""
    top = ROOT / "serve"
    loose = sorted(p.name for p in top.iterdir() if p.is_file() and p.suffix == ".py" and p.name != "__init__.py")
    assert not loose, f"modules at serve/'s top level: {loose}"
    folders = {p.name for p in top.iterdir() if p.is_dir() and any(p.rglob("*.py"))}  # not static/ nor a stale cache
    assert folders == {p.parent.name for p in top.glob("*/__init__.py")}, "a folder of modules that is no package"
