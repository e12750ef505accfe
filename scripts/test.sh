#!/usr/bin/env bash
# Sets up .venv and runs the default test suite (slow tests excluded; `-m slow` runs them) in two pytest-xdist
# workers, each test file in one worker (module fixtures computed once); `-n 0` after the command runs it in one
# process. Most tests are bound by TensorFlow's per-op overhead in one Python thread, so two workers keep two
# cores busy (a 2-core machine: 39 min in two workers; one worker had run 250 of the 859 tests in 30 min).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# format and lint first (seconds): `.venv/bin/ruff format .` and `.venv/bin/ruff check --fix .` repair most findings
.venv/bin/ruff format --check --quiet . || { echo "ruff format: files above need formatting" >&2; exit 1; }
.venv/bin/ruff check --quiet .
# the documentation site, warnings as errors (a docstring griffe cannot parse, a broken link): build/site
.venv/bin/mkdocs build --strict --quiet
export TF_CPP_MIN_LOG_LEVEL=3
exec .venv/bin/python -m pytest -n 2 --dist loadfile --durations=25 "$@"
