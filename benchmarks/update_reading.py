"""What a reader opens to follow one update of each method: the files, their lines, and the moves between them.

One training step of a small model is run eagerly (run_eagerly=True) and every line of bayes_keras that
`optimizer.apply` executes is recorded with a trace function: the files it runs (and their total lines),
the distinct lines it runs, how often consecutive lines change file (a reader's jumps), and the lines of
the definitions it enters (every top-level function and class of those files in which a line runs, whole,
less the methods of such a class in which none runs: what a reader reads of those files), and the lines of
those files' code alone (every docstring and comment deleted, formatted by ruff at the project's 100
columns: the fewest lines the same code can take in a formatted tree). The model's own
forward and backward pass (layers, BayesianModel) are not part of the update and are not counted; what
the optimizer calls during its update (step rules, preconditioners, curvature formulas, families) is.
With --whole-step, the whole `train_on_batch` is traced instead: every package file the step executes, the
layers' forward and backward pass and the trainer included (what a reader follows from model.fit to the
weight write).

Run on another checkout to compare versions (the counts are of that tree's files):
    python benchmarks/update_reading.py                       # this tree -> results/update_reading.{json,md}
    python benchmarks/update_reading.py --repo /tmp/before --stem update_reading_before
    python benchmarks/update_reading.py --whole-step            # -> results/step_reading.{json,md}
"""

import argparse
import ast
import collections
import functools
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))

METHODS = {
    "GaussianParticleFlow()": lambda bk: bk.optimizers.GaussianParticleFlow(),
    "SVGD()": lambda bk: bk.optimizers.SVGD(),
    "MatrixSVGD()": lambda bk: bk.optimizers.MatrixSVGD(),
    "MGVBP() (diagonal)": lambda bk: bk.optimizers.MGVBP(),
    "MeanFieldVI()": lambda bk: bk.optimizers.MeanFieldVI(),
}


def trace_update(bk, make, package_dir, whole_step=False):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype("float32")
    y = rng.integers(0, 3, 32)
    model = bk.zoo.mlp(8, 3, (16,), num_particles=4)
    optimizer = make(bk)
    model.compile(optimizer=optimizer, likelihood="categorical", dataset_size=32, run_eagerly=True)
    model.train_on_batch(x, y)  # builds the optimizer; the traced step is the second
    events = []

    def tracer(frame, event, arg):
        path = frame.f_code.co_filename
        if path.startswith(package_dir):
            if event == "line":
                events.append((os.path.relpath(path, os.path.dirname(package_dir)), frame.f_lineno))
            return tracer
        return None

    def traced(call):
        def run(*args, **kwargs):
            sys.settrace(tracer)
            try:
                return call(*args, **kwargs)
            finally:
                sys.settrace(None)

        return run

    if whole_step:
        traced(model.train_on_batch)(x, y)
    else:
        optimizer.apply = traced(optimizer.apply)
        model.train_on_batch(x, y)
    files = sorted({f for f, _ in events})
    lines = {f: sum(1 for _ in open(os.path.join(os.path.dirname(package_dir), f))) for f in files}
    executed = collections.Counter(f for f, _ in set(events))
    moves = sum(1 for (a, _), (b, _) in zip(events, events[1:]) if a != b)
    root = os.path.dirname(package_dir)
    entered = {
        f: _definitions_entered(os.path.join(root, f), {n for g, n in events if g == f})
        for f in files
    }
    return {
        "files": files,
        "file_lines": lines,
        "total_lines": sum(lines.values()),
        "executed_lines": dict(executed),
        "total_executed": sum(executed.values()),
        "moves": moves,
        "definition_lines": entered,
        "total_definition_lines": sum(entered.values()),
        "code_lines": {f: _code_lines(os.path.join(root, f)) for f in files},
    }


def _definitions_entered(path, ran):
    """Lines of the top-level functions and classes of `path` in which a line of `ran` lies, each whole
    (decorators included) except a class's methods in which no line ran."""

    def span(node):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        return first, node.end_lineno

    def entered(node):
        a, b = span(node)
        return any(a <= line <= b for line in ran)

    with open(path) as source:
        tree = ast.parse(source.read())
    total = 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and entered(
            node
        ):
            a, b = span(node)
            total += b - a + 1
            if isinstance(node, ast.ClassDef):
                for method in node.body:
                    if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and not entered(
                        method
                    ):
                        m0, m1 = span(method)
                        total -= m1 - m0 + 1
    return total


@functools.lru_cache(maxsize=None)  # the core files are on every method's path: formatted once
def _code_lines(path):
    """Lines of `path`'s code alone: its docstrings and comments deleted (ast.unparse keeps no comment),
    then formatted by ruff at 100 columns (which puts back the blank lines it requires)."""
    with open(path) as source:
        tree = ast.parse(source.read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    node.body = node.body[1:] or [ast.Pass()]
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--line-length", "100", "-"],
        input=ast.unparse(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(formatted.splitlines())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repo", default=os.path.dirname(HERE), help="checkout whose bayes_keras is measured"
    )
    parser.add_argument("--stem", default=None, help="results file name (default: by the mode)")
    parser.add_argument(
        "--whole-step",
        action="store_true",
        help="trace the whole train_on_batch, not only the update",
    )
    args = parser.parse_args()
    stem = args.stem or ("step_reading" if args.whole_step else "update_reading")
    what = "`model.train_on_batch`" if args.whole_step else "`optimizer.apply`"
    command = "python benchmarks/update_reading.py" + (" --whole-step" if args.whole_step else "")
    sys.path.insert(0, os.path.abspath(args.repo))
    import bayes_keras as bk

    package_dir = os.path.dirname(os.path.abspath(bk.__file__))
    sys.path.insert(0, HERE)
    import harness

    results = {
        name: trace_update(bk, make, package_dir, args.whole_step) for name, make in METHODS.items()
    }
    lines = [
        f"# Files and lines a reader follows through one {'training step' if args.whole_step else 'update'}"
        f" ({os.path.abspath(args.repo)})",
        "",
        "One eager training step of a 8-16-3 MLP with 4 particles; every bayes_keras line that "
        f"{what} executes (`{command}`).",
        "",
        "| method | files | their lines | their code alone, formatted | lines of the definitions entered "
        "| lines executed | moves between files |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {len(r['files'])} | {r['total_lines']} | {sum(r['code_lines'].values())} | "
            f"{r['total_definition_lines']} | {r['total_executed']} | {r['moves']} |"
        )
    lines += [
        "",
        "'their code alone, formatted': the same files with every docstring and comment deleted, "
        "formatted by ruff at 100 columns (the fewest lines their code takes in a formatted tree). "
        "'definitions entered': the top-level functions and classes in which a line runs, less the "
        "methods of such a class in which none runs.",
        "",
    ]
    for name, r in results.items():
        lines.append(f"- {name}: " + ", ".join(f"{f} ({r['file_lines'][f]})" for f in r["files"]))
    harness.save_results(
        stem,
        {"repo": os.path.abspath(args.repo), "methods": results, "machine": harness.machine_info()},
        lines,
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
