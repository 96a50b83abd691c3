"""Keeps docs/api.md's "Not yet" list true: each item that says something does not exist
names code that would compile if it did, and that code must not compile. An item added to
the list needs an entry here (or one that says why no code can show it); an item whose code
starts compiling (the feature landed) fails until the docs say so.

A control, code that does compile with the same preamble, shows that a failure is the
item's and not the preamble's.

Usage: check_not_yet.py SOURCE_DIR [COMPILER]"""
import concurrent.futures
import pathlib
import re
import subprocess
import sys
import tempfile

PREAMBLE = """#include <dimsum/dimsum.hpp>
#include <cstdint>
namespace ds = dimsum;
using A = ds::axis<"a">;
int main() {
    ds::tensor<float, A> x(A{4});
    ds::tensor<double, A> xd(A{4});
    ds::tensor<std::int64_t, A> ids(A{4});
    (void)x; (void)xd; (void)ids;
"""

CONTROL = "auto s = ds::sum<A>(x); auto c = ds::cast<float>(xd); auto y = ds::slice<A, 1, 3>(x); (void)s; (void)c; (void)y;"

# The bold title of each item -> the code that would compile if it existed, or None and why.
ITEMS = {
    "Negative slice bounds": "auto y = ds::slice<A, -3, 4>(x);",
    "linspace": "auto y = ds::linspace<float>(A{5}, 0.0f, 1.0f);",
    "Boolean tensors": "ds::tensor<bool, A> m = x > 0.0f;",
    "A cast to float in the middle of a formula of double": "auto y = ds::cast<float>(xd + xd);",
    "Positional reductions": "auto y = ds::sum(x, 0);",
    "bf16 kernels": None,  # how far the bf16 paths go: no absence to show, but fp16's, below
    "fp16": "ds::fp16 h{};",
    "A fast GPU backend": None,  # a speed, measured in performance.md
    # the bf16 half (the GPU half is a speed: host tensors copied, attention step by step)
    "bf16 gradients in bf16, training on the GPU at its speed":
        "ds::tensor<ds::bf16, A> w(A{4}), g(A{4}); ds::backward(ds::sum<A>(ds::cast<float>(w)), w, g);",
}
# Results of integer formulas: "Integer tensors are inputs only", inside the boolean item.
EXTRA = {"integer results": "ds::tensor<std::int64_t, A> r = ids + ids;"}


def compiles(compiler, include, body):
    with tempfile.NamedTemporaryFile("w", suffix=".cpp") as f:
        f.write(PREAMBLE + "    " + body + "\n}\n")
        f.flush()
        run = subprocess.run([compiler, "-std=c++20", "-fsyntax-only", "-fopenmp", "-I", str(include), f.name],
                             capture_output=True, text=True)
        return run.returncode == 0


def main():
    root = pathlib.Path(sys.argv[1])
    compiler = sys.argv[2] if len(sys.argv) > 2 else "c++"
    api = (root / "docs" / "api.md").read_text()
    section = re.search(r"^## Not yet\n(.*?)(?=^## |\Z)", api, re.S | re.M)
    if not section:
        print("docs/api.md has no '## Not yet' section")
        return 1
    titles = re.findall(r"\*\*(.+?)\*\*", section.group(1))
    problems = [f"'{t}' is in the Not yet list but has no entry in {pathlib.Path(__file__).name}"
                for t in titles if t not in ITEMS]
    problems += [f"{pathlib.Path(__file__).name} has an entry for '{t}', which the Not yet list no longer has"
                 for t in ITEMS if t not in titles]
    cases = {"control": CONTROL, **{t: c for t, c in ITEMS.items() if c}, **EXTRA}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(cases, pool.map(lambda body: compiles(compiler, root / "include", body), cases.values())))
    if not results.pop("control"):
        problems.append("the control does not compile: the preamble or the compiler is broken, so nothing is shown")
    for title, compiled in results.items():
        if compiled:
            problems.append(f"'{title}' is listed as not existing, yet this compiles: {cases[title]}")
    for p in problems:
        print(p)
    print(f"{len(results)} items checked against the code, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
