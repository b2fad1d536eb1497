"""The house has no circles: over serve/, tools/ and strata_cli/, no module imports another that imports it
back, directly or through others (every import counts, deferred ones inside functions too, read with ast),
and the HTTP layer (serve/http/server.py) imports neither the command line nor the engine client."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("serve", "tools", "strata_cli")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(path: pathlib.Path, name: str, known) -> set[str]:
    """The project modules `path` imports (an import of a package's name means its __init__)."""
    found = set()
    pkg = name.rsplit(".", 1)[0] if not path.name == "__init__.py" else name
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: imports_of(path, name, mods) for name, path in mods.items()}


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
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def test_the_http_layer_sees_neither_the_command_line_nor_the_engine_client():
    g = graph()
    for mod in ("serve.http.server", "serve.api.openai", "serve.api.anthropic"):
        bad = {m for m in g[mod] if m.startswith("strata_cli") or m in ("serve.engine_client.engine", "serve.engine_client.batch",
                                                                          "serve.engine_client.protocol")}
        assert not bad, f"{mod} imports {sorted(bad)}"
