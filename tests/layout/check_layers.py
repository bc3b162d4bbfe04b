#!/usr/bin/env python3
"""The folders of lib/kvasir depend one way (README "Layout").

Reads every #include "kvasir/<folder>/..." in lib/kvasir/<folder>/ and app/,
and fails, naming the file and line, when a folder includes one that is not
below it in LAYERS, or when the folder graph has a cycle (which LAYERS
forbids anyway; the cycle check also catches a LAYERS table edited into a
circle). Also checks that README.md's layout section names every folder.

Usage: check_layers.py [REPO_ROOT]
"""
import pathlib
import re
import sys

# Each folder and the folders it may include (directly). Lower layers first.
LAYERS = {
    "core": set(),
    "model": {"core"},
    "backend": {"core"},
    "metrics": {"core"},
    "arch": {"core", "model", "backend"},
    "steps": {"core", "model", "backend", "metrics", "arch"},
    "audit": {"core", "model", "backend", "metrics", "arch", "steps"},
    "report": {"core", "model", "backend", "metrics", "arch", "steps", "audit"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"kvasir/([a-z_]+)/')


def unit_cycles(lib: pathlib.Path) -> list:
    """Circles between the files of one folder. A unit is a file's stem (foo.hpp
    and foo.cpp together, so a header and its implementation count as one):
    unit A depends on unit B when a file of A includes one of B's. A circle
    (gguf includes quant, quant's implementation includes gguf) means neither
    can be understood, tested or moved without the other."""
    problems = []
    local = re.compile(r'^\s*#\s*include\s+"kvasir/([a-z_]+)/([A-Za-z0-9_]+)\.[a-z]+"')
    for folder in sorted(p for p in lib.iterdir() if p.is_dir()):
        deps = {}
        for path in sorted(folder.rglob("*")):
            if path.suffix not in {".hpp", ".cpp", ".inc", ".h", ".cuh"}:
                continue
            unit = path.stem
            deps.setdefault(unit, set())
            for line in path.read_text(errors="replace").splitlines():
                m = local.match(line)
                if m and m.group(1) == folder.name and m.group(2) != unit:
                    deps[unit].add(m.group(2))
        state, reported = {}, set()

        def visit(u, stack):
            state[u] = 1
            for d in sorted(deps.get(u, ())):
                if state.get(d) == 1:
                    cycle = stack[stack.index(d):] + [d]
                    key = frozenset(cycle)
                    if key not in reported:
                        reported.add(key)
                        problems.append(f"include circle inside lib/kvasir/{folder.name}/: " + " -> ".join(cycle))
                elif state.get(d) is None and d in deps:
                    visit(d, stack + [d])
            state[u] = 2

        for u in sorted(deps):
            if state.get(u) is None:
                visit(u, [u])
    return problems


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    lib = root / "lib" / "kvasir"
    problems = []
    folders = sorted(p.name for p in lib.iterdir() if p.is_dir())
    for f in folders:
        if f not in LAYERS:
            problems.append(f"lib/kvasir/{f}/: a folder the layering does not know (add it to LAYERS and the README)")
    graph = {f: set() for f in LAYERS}
    for folder in LAYERS:
        for path in sorted((lib / folder).rglob("*")):
            if path.suffix not in {".hpp", ".cpp", ".inc", ".h", ".cuh", ".cl"}:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) == folder:
                    continue
                dep = m.group(1)
                graph[folder].add(dep)
                if dep not in LAYERS[folder]:
                    problems.append(f"{path.relative_to(root)}:{n}: {folder}/ includes {dep}/ "
                                    f"({folder}/ may include only: {', '.join(sorted(LAYERS[folder])) or 'nothing'})")
    # Cycles in what the files actually include.
    state = {}

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep] if dep in stack else [node, dep]
                problems.append("include cycle between folders: " + " -> ".join(cycle))
            elif dep in graph and state.get(dep) is None:
                visit(dep, stack + [dep])
        state[node] = 2

    for f in graph:
        if state.get(f) is None:
            visit(f, [f])
    problems += unit_cycles(lib)
    readme = (root / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0] if "## Layout" in readme else ""
    if not section:
        problems.append("README.md has no '## Layout' section")
    for f in folders:
        if not re.search(rf"^\s+{f}/\s", section, re.M) and f"lib/kvasir/{f}/" not in section:
            problems.append(f"README.md's Layout section does not mention lib/kvasir/{f}/")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(LAYERS)} folders, {sum(len(v) for v in graph.values())} folder dependencies, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
