#!/usr/bin/env python3
"""Fails when files of one folder of src/ import each other in a cycle.

In each folder, every `.rs` file other than `mod.rs` (and every sub-folder) is a module; a file
imports a sibling when its code (comments left out) names it as `super::name` or
`crate::<folder>::name`, alone or in a `{...}` group. The folder's `mod.rs` is the parent that
declares the siblings and is left out: children using what it shares is layering, not a cycle.
src/ itself is not checked: its top-level modules are the crate's roles, layered as
docs/architecture.md describes, and some use each other both ways (the claimer and the
application it belongs to, say).
Usage: scripts/check_module_cycles.py [src]
"""
import os
import re
import sys


def code_of(path):
    with open(path, encoding="utf-8") as f:
        return "\n".join(l for l in f.read().splitlines() if not l.lstrip().startswith("//"))


def referenced(code, prefixes, names):
    found = set()
    for prefix in prefixes:
        p = re.escape(prefix)
        for m in re.finditer(p + r"([A-Za-z_][A-Za-z0-9_]*)\b", code):
            found.add(m.group(1))
        for m in re.finditer(p + r"\{([^}]*)\}", code):
            for part in m.group(1).split(","):
                found.add(part.strip().split("::")[0].split(" ")[0])
    return found & names


def module_files(folder, name):
    """The files whose code is the module `name` of `folder` (a file, or a folder's files)."""
    if os.path.isfile(os.path.join(folder, name + ".rs")):
        return [os.path.join(folder, name + ".rs")]
    sub = os.path.join(folder, name)
    return [os.path.join(sub, "mod.rs")] if os.path.isfile(os.path.join(sub, "mod.rs")) else []


def cycles(graph):
    """Every cycle of the graph, each once (as found from its smallest node)."""
    out = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    out.append(path + [start])
                elif nxt > start and nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    failed = False
    for folder, dirs, files in os.walk(root):
        names = {f[:-3] for f in files if f.endswith(".rs") and f != "mod.rs"}
        names |= {d for d in dirs if os.path.isfile(os.path.join(folder, d, "mod.rs"))}
        rel = os.path.relpath(folder, root)
        if rel == ".":
            continue
        prefixes = ["super::", "crate::" + rel.replace(os.sep, "::") + "::"]
        graph = {}
        for name in names:
            code = "\n".join(code_of(p) for p in module_files(folder, name))
            graph[name] = referenced(code, prefixes, names) - {name}
        for cycle in cycles(graph):
            failed = True
            print(f"{folder}: import cycle: {' -> '.join(cycle)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
