"""The package's layout rules, checked on the source: no bayes_keras import inside a function, no import
cycle between modules, every public optimizer at most one class below BayesianOptimizer, and nothing
shipped that points into the development notes outside the repository."""

import ast
import inspect
import os
import re
import subprocess
import sys

import pytest

import bayes_keras as bk
from paths import ROOT

PACKAGE = os.path.join(ROOT, "bayes_keras")


def _modules():
    out = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path[:-3], ROOT).replace(os.sep, ".")
                out[module[: -len(".__init__")] if module.endswith(".__init__") else module] = path
    return out


def _imports(path):
    """(top_level, names) for every import statement of bayes_keras modules in the file."""
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        names = [n for n in names if n == "bayes_keras" or n.startswith("bayes_keras.")]
        if names:
            yield node.col_offset == 0, names


def test_no_bayes_keras_import_inside_a_function():
    inside = [
        f"{os.path.relpath(path, ROOT)}: {names[0]}"
        for path in _modules().values()
        for top, names in _imports(path)
        if not top
    ]
    assert inside == []


def test_no_import_cycle_between_modules():
    modules = _modules()
    edges = {}
    for module, path in modules.items():
        targets = set()
        for _, names in _imports(path):
            for name in names:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    # a module's own parent packages are imported before it by Python itself
                    if (
                        target in modules
                        and target != module
                        and not module.startswith(target + ".")
                    ):
                        targets.add(target)
        edges[module] = targets

    def reaches(start, goal, seen):
        for nxt in edges[start]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    cycles = [m for m in modules if reaches(m, m, set())]
    assert cycles == []


def test_every_public_optimizer_is_at_most_one_class_below_the_contract():
    for name in bk.optimizers.__all__:
        cls = getattr(bk.optimizers, name)
        if inspect.isclass(cls) and issubclass(cls, bk.optimizers.BayesianOptimizer):
            between = cls.__mro__[1 : cls.__mro__.index(bk.optimizers.BayesianOptimizer)]
            assert len(between) <= 1, (name, [c.__name__ for c in between])


def test_nothing_shipped_points_outside_the_repository():
    shipped = [
        PACKAGE,
        os.path.join(ROOT, "docs"),
        os.path.join(ROOT, "examples"),
        os.path.join(ROOT, "notebooks"),
    ]
    files = [os.path.join(ROOT, "README.md")] + [
        os.path.join(d, f)
        for top in shipped
        for d, _, fs in os.walk(top)
        for f in fs
        if f.endswith((".py", ".md", ".ipynb"))
    ]
    pattern = re.compile(r"\.\./shared|shared/papers|DESIGN\.md")
    hits = [
        os.path.relpath(f, ROOT) for f in files if pattern.search(open(f, encoding="utf-8").read())
    ]
    assert hits == []


@pytest.mark.subprocess
def test_import_does_not_need_keras_hub():
    """keras-hub is an optional extra: `import bayes_keras` works where importing it fails."""
    code = "import sys; sys.modules['keras_hub'] = None; import bayes_keras; print('ok')"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
