#!/usr/bin/env python3
"""Fails when claimd's modules depend on each other in a cycle, or a layer depends upward.

The module tree is read from the files under src/ (`a/b.rs` and `a/b/mod.rs` are `a::b`).
A module depends on another when its code (comments and its unit tests left out) names it
through `crate::`, `super::` or `self::`, alone or in a `{...}` group; a path is resolved to
the deepest module it names. Then, in every folder (the crate root included), the folder's
children are compared: child X depends on child Y when anything inside X depends on anything
inside Y. Any cycle among the children of one folder fails the check, at every depth, so a
cycle between folders (`engine::claimer` -> `edge::intake` -> `engine::claimer`) is seen at the
folder where the two meet. A module using its parent or a parent using its children is not a
cycle: that is how a folder shares its parts.

At the root the top-level modules are layers and may only depend downward, in LAYERS order
(docs/architecture.md explains each).

Usage: scripts/check_module_cycles.py [src]
"""

import collections
import os
import re
import sys

LAYERS = ["domain", "store", "provider", "config", "engine", "ops", "edge", "service", "cli"]
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TEST_CFG = re.compile(r"#\[cfg\((all\()?test\b")
TEST_MOD = re.compile(r"\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{")


def code_of(text):
    """The code of a file: no comments, no string contents, no trailing unit tests."""
    lines = text.splitlines()
    kept = []
    for i, line in enumerate(lines):
        if TEST_CFG.match(line.strip()) and i + 1 < len(lines) and TEST_MOD.match(lines[i + 1]):
            break
        if line.lstrip().startswith("//"):
            continue
        kept.append(line)
    code = "\n".join(kept)
    code = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', code)
    code = re.sub(r"//[^\n]*", "", code)
    return re.sub(r"/\*.*?\*/", "", code, flags=re.S)


def use_tree(code, i):
    """The paths of the use-tree (or plain path) starting at code[i], and where it ends."""
    paths, current = [], []
    while i < len(code):
        while i < len(code) and code[i].isspace():
            i += 1
        if code.startswith("{", i):
            i += 1
            while True:
                sub, i = use_tree(code, i)
                paths += [current + p for p in sub]
                while i < len(code) and code[i].isspace():
                    i += 1
                if code.startswith(",", i):
                    i += 1
                    continue
                if code.startswith("}", i):
                    i += 1
                break
            return paths, i
        m = IDENT.match(code, i)
        if not m:
            break
        current = current + [m.group(0)]
        i = m.end()
        if not code.startswith("::", i):
            break
        i += 2
    paths.append(current)
    return paths, i


def modules(root):
    """Module path (a tuple) -> its files, for every .rs file that is not a test module."""
    found = collections.defaultdict(list)
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            parts = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
            if "tests" in parts:
                continue
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                parts = []
            found[tuple(parts)].append(os.path.join(folder, name))
    return found


def dependencies(root):
    mods = modules(root)
    deps = collections.defaultdict(set)
    for mod, files in mods.items():
        for path in files:
            with open(path, encoding="utf-8") as f:
                code = code_of(f.read())
            # For a file module `a::b`, `self` is a::b and `super` is a.
            for m in re.finditer(r"(?<![A-Za-z0-9_:])(crate|super|self)::", code):
                base = [] if m.group(1) == "crate" else list(mod)
                if m.group(1) == "super":
                    base = base[:-1]
                for p in use_tree(code, m.end())[0]:
                    full = list(base)
                    for seg in p:
                        if seg == "super":
                            full = full[:-1]
                        elif seg != "self":
                            full.append(seg)
                    while full and tuple(full) not in mods:
                        full.pop()
                    if tuple(full) != mod:
                        deps[mod].add(tuple(full))
    return mods, deps


def cycles(graph):
    """Every elementary cycle of a small graph, each once (from its smallest node)."""
    out = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    out.append(path + [start])
                elif nxt > start and nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    mods, deps = dependencies(root)
    folders = collections.defaultdict(lambda: collections.defaultdict(set))
    upward = []
    for a, targets in deps.items():
        for b in targets:
            i = 0
            while i < min(len(a), len(b)) and a[i] == b[i]:
                i += 1
            if i == len(a) or i == len(b):
                continue  # a parent and its descendant
            folders[a[:i]][a[i]].add(b[i])
            if i == 0 and a[0] in LAYERS and b[0] in LAYERS:
                if LAYERS.index(b[0]) > LAYERS.index(a[0]):
                    upward.append(f"{'::'.join(a)} -> {'::'.join(b)}")
    failed = False
    for line in sorted(upward):
        failed = True
        print(f"upward dependency (layers, bottom to top: {', '.join(LAYERS)}): {line}")
    for folder in sorted(folders):
        for cycle in cycles(folders[folder]):
            failed = True
            where = "crate" if not folder else "crate::" + "::".join(folder)
            print(f"{where}: import cycle: {' -> '.join(cycle)}")
    top = {m[0] for m in mods if m}
    for name in sorted(top - set(LAYERS)):
        failed = True
        print(f"src/{name}: a top-level module that is not a layer ({', '.join(LAYERS)})")
    edges = sum(len(t) for t in deps.values())
    print(f"{len(mods)} modules, {edges} dependencies between them")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
