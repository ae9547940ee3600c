"""The repository's structure, checked by reading the imports (``ast``) and the routes.

- no import cycle among the modules of ``app/`` (at module level or inside functions);
- no module of ``app/api`` imports ``app/web`` (pages use the API's services, never the reverse);
- nothing in ``agent/`` imports ``app`` (the agent installs without the service's dependencies);
- nothing in ``bench/`` imports ``tests`` (benchmarks run from a checkout without the test suite);
- every page answers a signed-out browser with the sign-in redirect and every API route a
  signed-out client with problem details, because of the router each was registered on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` at ``path`` imports, anywhere in it.

    ``from pkg import sub`` counts as importing ``pkg.sub`` when that is a module, else ``pkg``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(mod)
    return {m for m in found if m in known and m != name}


def import_graph(*packages: str) -> dict[str, set[str]]:
    files = {module_name(p, REPO): p for pkg in packages for p in (REPO / pkg).rglob("*.py")}
    known = set(files)
    return {name: imported_modules(path, name, known) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def imports_from(graph: dict[str, set[str]], importer: str, imported: str) -> list[str]:
    """``a -> b`` for every module ``a`` under ``importer`` importing a module under ``imported``."""
    def under(m: str, p: str) -> bool:
        return m == p or m.startswith(p + ".")

    return sorted(f"{a} -> {b}" for a, deps in graph.items() if under(a, importer) for b in deps if under(b, imported))


def test_no_import_cycle_inside_app():
    assert cycles(import_graph("app")) == []


def test_api_modules_do_not_import_pages():
    assert imports_from(import_graph("app"), "app.api", "app.web") == []


def test_agent_does_not_import_the_service():
    assert imports_from(import_graph("agent", "app"), "agent", "app") == []


def test_benchmarks_do_not_import_the_tests():
    assert imports_from(import_graph("bench", "tests"), "bench", "tests") == []


def test_the_checks_catch_a_cycle_and_a_forbidden_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.b\n")
    files = {module_name(p, tmp_path): p for p in (tmp_path / "pkg").rglob("*.py")}
    graph = {n: imported_modules(p, n, set(files)) for n, p in files.items()}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert imports_from(graph, "pkg.c", "pkg.b") == ["pkg.c -> pkg.b"]


def _routes(routes, prefix: str = ""):
    """``(full path, route)`` of every route, looking into included routers."""
    for r in routes:
        if hasattr(r, "original_router"):  # FastAPI keeps an included router as one entry
            yield from _routes(r.original_router.routes, prefix + r.include_context.prefix)
        else:
            yield prefix + getattr(r, "path", ""), r


def test_every_application_of_a_process_shares_the_routes_built_at_import():
    """No route is a wrapped router (which FastAPI builds anew for each application, on its
    first requests); the API and page routes of two applications are the same objects."""
    from app.main import create_app

    first, second = create_app(), create_app()
    assert [r for r in first.routes if hasattr(r, "original_router")] == []
    shared = [r for r in first.routes if getattr(r, "path", "").startswith(("/api/v1/", "/login", "/book"))]
    assert len(shared) > 50
    assert {id(r) for r in shared} <= {id(r) for r in second.routes}


def _static_get_routes(app, route_class):
    return sorted(path for path, r in _routes(app.routes) if type(r) is route_class
                  and "GET" in r.methods and "{" not in path)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_signed_out_browser_gets_the_sign_in_redirect_on_every_page_and_problem_details_on_the_api(client):
    from fastapi.routing import APIRoute

    from app.web.routing import PageRoute

    pages = _static_get_routes(client.app, PageRoute)
    assert "/" in pages and "/reports/usage" in pages
    public = {"/login", "/login/oidc", "/login/oidc/callback"}  # the sign-in pages themselves
    for path in sorted(set(pages) - public):
        r = client.get(path, headers={"Accept": "text/html"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next="), (path, r.status_code)
    api = [p for p in _static_get_routes(client.app, APIRoute) if p.startswith("/api/v1/")]
    assert "/api/v1/reports/usage" in api and "/api/v1/reservations" in api
    for path in api:
        r = client.get(path, headers={"Accept": "text/html"})
        if r.status_code == 200:  # public API documents (e.g. feeds by token) answer without a session
            continue
        assert r.headers["content-type"].startswith("application/problem+json"), (path, r.status_code)
