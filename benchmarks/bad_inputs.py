"""The bad-input sweep: every public class of bayes_keras built with one bad numeric argument at a time.

For every class a user constructs (optimizers, layers, priors, kernels, likelihoods, schedules,
preconditioners, step rules) and every constructor argument whose default is a number, each of NaN, +inf,
-inf, a string and a bool is passed, once to the constructor and once through `from_config` (a saved
config). Expected ("clear"): a ValueError or TypeError at once whose message names the argument; "unclear"
(one that does not), "obscure" (any other exception) and "silent" (the bad value kept, to fail or be
skipped later) are defects. tests/training/test_bad_input_sweep.py
runs the same sweep. Per-step data built by the model itself (StepInfo) and curvature operators (built
by preconditioners from tensors) are not user inputs and are left out.

Usage:
    python benchmarks/bad_inputs.py
Writes benchmarks/results/bad_inputs.{json,md}.
"""

import collections
import inspect
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import bayes_keras as bk  # noqa: E402

BAD_VALUES = {
    "NaN": float("nan"),
    "+inf": float("inf"),
    "-inf": -float("inf"),
    "a string": "bad",
    "True": True,
}
NOT_USER_INPUTS = {
    "StepInfo",
    "ParticleView",
    "DenseCurvature",
    "KFACCurvature",
    "ScaledIdentityCurvature",
    "ParticleMixture",
    "Curvature",
    "KroneckerOperator",
    "StateWrites",
}
REQUIRED = {
    "units": 2,
    "filters": 2,
    "kernel_size": 2,
    "input_dim": 5,
    "output_dim": 2,
    "rate": 0.1,
    "initial_learning_rate": 0.1,
    "tau": 10,
    "pool_size": 2,
    "activation": "relu",
    "rank": 2,
    "num_heads": 2,
    "key_dim": 2,
    "stddev": 0.1,
}
EXTRA = {
    "Embedding": {"num_particles": 2},
    "Bidirectional": {"layer": lambda: bk.layers.LSTM(2)},
    "PerParticle": {"layer": lambda: keras.layers.Dense(2)},
    "EinsumDense": {"equation": "ab,bc->ac", "output_shape": 2},
    "LoRAEinsumDense": {"equation": "ab,bc->ac", "output_shape": 2},
    "LoRAEmbedding": {"num_particles": 2},
}


PUBLIC_MODULES = {
    "optimizers": bk.optimizers,
    "layers": bk.layers,
    "priors": bk.priors,
    "kernels": bk.kernels,
    "likelihoods": bk.likelihoods,
    "schedules": bk.schedules,
    "preconditioners": bk.preconditioners,
    "step_rules": bk.step_rules,
}


def public_classes():
    found = {
        getattr(m, n) for m in PUBLIC_MODULES.values() for n in dir(m) if not n.startswith("_")
    }
    return sorted(
        (
            c
            for c in found
            if inspect.isclass(c)
            and c.__module__.startswith("bayes_keras")
            and c.__name__ not in NOT_USER_INPUTS
        ),
        key=lambda c: c.__name__,
    )


def _qualified(cls):
    """The public name, e.g. "priors.Normal" (priors.Normal and likelihoods.Normal share a name)."""
    for name, module in PUBLIC_MODULES.items():
        if getattr(module, cls.__name__, None) is cls:
            return f"{name}.{cls.__name__}"
    return f"{cls.__module__.split('.')[1]}.{cls.__name__}"


def base_arguments(cls):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    args = {
        p.name: REQUIRED.get(p.name, 1)
        for p in params
        if p.default is inspect.Parameter.empty and p.kind == p.POSITIONAL_OR_KEYWORD
    }
    args.update({k: v() if callable(v) else v for k, v in EXTRA.get(cls.__name__, {}).items()})
    return args


def numeric_arguments(cls):
    """Arguments whose default is a number, and required ones the sweep fills with a number (units, rate...)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [
        p.name
        for p in params
        if p.name != "seed"
        and (
            (isinstance(p.default, (int, float)) and not isinstance(p.default, bool))
            or (
                p.default is inspect.Parameter.empty
                and isinstance(REQUIRED.get(p.name), (int, float))
            )
        )
    ]


def _outcome(build, argument):
    """The outcome: "clear", a ValueError / TypeError whose message names the argument; "unclear", one
    that does not; "obscure", any other exception; "silent", the bad value accepted."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build()
    except (ValueError, TypeError) as error:
        named = argument in str(error) or argument.replace("_", " ") in str(error)
        return "clear" if named else f"unclear ({str(error)[:60]})"
    except Exception as error:  # noqa: BLE001 (what the sweep looks for)
        return f"obscure ({type(error).__name__})"
    return "silent"


def cases():
    """Yield (class name, argument, bad value label, door, outcome)."""
    for cls in public_classes():
        try:
            args = base_arguments(cls)
            config = cls(**args).get_config() if hasattr(cls, "get_config") else None
        except Exception:  # noqa: BLE001 (abstract bases and classes that need tensors)
            continue
        for name in numeric_arguments(cls):
            for label, value in BAD_VALUES.items():
                fresh = {
                    k: (v() if callable(v) else v)
                    for k, v in {**args, **EXTRA.get(cls.__name__, {})}.items()
                }
                yield (
                    _qualified(cls),
                    name,
                    label,
                    "constructor",
                    _outcome(lambda: cls(**{**fresh, name: value}), name),
                )
                if config is not None and name in config:
                    yield (
                        _qualified(cls),
                        name,
                        label,
                        "from_config",
                        _outcome(lambda: cls.from_config({**config, name: value}), name),
                    )


def main():
    rows = [dict(zip(("class", "argument", "value", "door", "outcome"), c)) for c in cases()]
    kinds = ("clear", "unclear", "obscure", "silent")
    by_class = collections.defaultdict(collections.Counter)
    for r in rows:
        by_class[r["class"]][r["outcome"].split(" ")[0]] += 1
    total = collections.Counter(r["outcome"].split(" ")[0] for r in rows)
    lines = [
        "# Bad-input sweep (benchmarks/bad_inputs.py)",
        "",
        f"{len(rows)} cases: every public class, every numeric constructor argument, each of "
        f"{', '.join(BAD_VALUES)}, through the constructor and through from_config. "
        + "; ".join(f"{k}: {total[k]}" for k in kinds)
        + ".",
        "",
        "| class | cases | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for name in sorted(by_class):
        c = by_class[name]
        lines.append(
            f"| {name} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in kinds) + " |"
        )
    defects = [r for r in rows if r["outcome"] != "clear"]
    if defects:
        lines += ["", "Not clear:", ""] + [
            f"- {r['class']}({r['argument']}={r['value']}) via {r['door']}: {r['outcome']}"
            for r in defects
        ]
    import harness  # noqa: E402 (only for writing results)

    harness.save_results("bad_inputs", {"rows": rows, "machine": harness.machine_info()}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
