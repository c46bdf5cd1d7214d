#!/usr/bin/env python3
"""No source file over 600 lines of code outside its tests.

Counts the lines of each `src/**/*.rs` file that are neither blank nor comments (`//`, `//!`,
`///`), stopping at the file's unit tests (`#[cfg(test)]` followed by `mod ... {`, which claimd
keeps at the end of a file). Files that are test modules themselves (`tests.rs`, `tests/`) are
not counted. Prints the largest files and exits 1 naming every file over the limit.
"""

import pathlib
import re
import sys

LIMIT = 600
ROOT = pathlib.Path(__file__).resolve().parent.parent / "src"


def code_lines(text: str) -> int:
    lines = text.splitlines()
    count = 0
    for i, line in enumerate(lines):
        stripped = line.strip()
        if re.match(r"#\[cfg\((all\()?test\b", stripped) and i + 1 < len(lines) and re.match(
            r"\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", lines[i + 1]
        ):
            break
        if not stripped or stripped.startswith("//"):
            continue
        count += 1
    return count


def main() -> int:
    sizes = []
    for path in sorted(ROOT.rglob("*.rs")):
        rel = path.relative_to(ROOT.parent)
        if path.name == "tests.rs" or "tests" in path.relative_to(ROOT).parts[:-1]:
            continue
        sizes.append((code_lines(path.read_text()), str(rel)))
    sizes.sort(reverse=True)
    for n, rel in sizes[:5]:
        print(f"{n:5} {rel}")
    over = [(n, rel) for n, rel in sizes if n > LIMIT]
    for n, rel in over:
        print(f"{rel}: {n} lines of code outside its tests (limit {LIMIT})", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
