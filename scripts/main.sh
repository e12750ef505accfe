#!/usr/bin/env bash
# Sets up .venv and runs the main job: Bayesian LeNet-5 on digits with GPF vs baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=3
# The table and the reliability diagram go to build/main_job (ignored by git), so running the README's command
# leaves the checkout clean; `python examples/lenet_digits.py` alone updates benchmarks/results.
exec .venv/bin/python examples/lenet_digits.py --out build/main_job "$@"
