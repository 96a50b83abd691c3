#!/usr/bin/python3
"""Every code block in README.md and docs/*.md must be quoted from a file ctest builds.

A ```cpp or ```cmake block is preceded by a line `<!-- snippet: PATH -->` naming that file
(under examples/ or tests/, or a library header, which every test that includes it
compiles); its lines must appear, in order and together, in the file.
Blocks of shell commands or program output (```sh, ```text) are not code and not checked,
except a ```sh block that names its file the same way (a command a test runs).
"""
import pathlib
import re
import sys

# the folders whose files ctest builds: the examples, the tests (their folders mirror
# include/dimsum/) and the library's headers
BUILT = ("examples/", "include/dimsum/") + tuple(
    f"tests/{folder}/" for folder in ("backend", "compile_fail", "consumer", "core", "evaluation", "interop", "nn", "ops",
                                      "runtime", "shape", "support", "tensor"))


def blocks(text):
    """(snippet path or None, code, line number) for each ```cpp and ```cmake block."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.strip() in ("```cpp", "```cmake", "```sh"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            tag = re.match(r"<!-- snippet: (\S+) -->", lines[i - 1].strip()) if i > 0 else None
            if line.strip() == "```sh" and not tag:
                continue
            yield (tag.group(1) if tag else None), lines[i + 1:end], i + 1


def main(root):
    root = pathlib.Path(root)
    problems, count = [], 0
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for source, code, line in blocks(doc.read_text()):
            count += 1
            where = f"{doc.relative_to(root)}:{line}"
            if source is None or not source.startswith(BUILT) or not (root / source).is_file():
                problems.append(f"{where}: no `<!-- snippet: FILE -->` naming a file that ctest builds")
                continue
            lines = [l.rstrip() for l in (root / source).read_text().split("\n")]
            code = [l.rstrip() for l in code]
            if not any(lines[k:k + len(code)] == code for k in range(len(lines) - len(code) + 1)):
                problems.append(f"{where}: this block is not a verbatim excerpt of {source}")
    for p in problems:
        print(p)
    print(f"{count} code blocks checked, {len(problems)} problems")
    return 1 if problems or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
