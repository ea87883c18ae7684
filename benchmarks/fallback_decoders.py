"""The posterior decoders against the paper's reads, one experiment each (docs/verdicts.md,
"Attacks that fall back to their prior").

For fedrec-rated-items, ncf-update-leak and fedsplit-inference on the tiny configurations of
``benchmarks/verdict_calibration.py`` (``PROTOCOLS``): uploads replaced by noise (the
calibration's null defense), a weak leak and no noise; per row the default (posterior) decoder,
its null arm, the prior library and the paper's read (``decoder=grid``, ``decoder=intersection``,
``prior_blend=false``). Run: ``python benchmarks/fallback_decoders.py`` (about a minute).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import verdict_calibration as vc  # noqa: E402

from privaudit import registry  # noqa: E402
from privaudit.data.synthetic import synthetic  # noqa: E402

#: protocol -> (attack, paper-read parameters, metrics shown)
ATTACKS = {
    "fedrec": ("fedrec-rated-items", {"decoder": "grid"}, ("accuracy", "auc", "rating_accuracy")),
    "fedncf": ("ncf-update-leak", {"decoder": "intersection"}, ("f1",)),
    "fedsplit": ("fedsplit-inference", {"prior_blend": False}, ("relative_error_unknown", "rating_accuracy")),
}
#: (protocol, uploads, defense list builder, protocol seed)
CASES = (
    ("fedrec", "null-replace", "null", 7),
    ("fedrec", "Laplace 0.03", 0.03, 2007),
    ("fedrec", "noise-free", 0.0, 7),
    ("fedncf", "null-dense", "null", 7),
    ("fedncf", "Laplace 0.05 (id sets intact)", 0.05, 7),
    ("fedsplit", "null-replace", "null", 7),
    ("fedsplit", "Laplace 0.3", 0.3, 7),
    ("fedsplit", "noise-free", 0.0, 7),
)


def main() -> None:
    registry._register("defense", "null-replace")(vc.NullReplace)
    registry._register("defense", "null-dense")(vc.NullDense)
    print("| protocol, uploads (seed) | metric | new default | null arm | prior library | paper's read |")
    print("|---|---|---|---|---|---|")
    for protocol, label, noise, seed in CASES:
        data_kw, config, _, always = vc.PROTOCOLS[protocol]
        defenses = [registry.get("defense", d.pop("name"))(**d) for d in (dict(x) for x in always)]
        if noise == "null":
            defenses.append(registry.get("defense", vc.NULL_DEFENSE.get(protocol, "null-replace"))())
        elif noise:
            defenses.append(registry.get("defense", "laplace")(scale=noise))
        t = registry.get("protocol", protocol)().run(synthetic(seed=0, **data_kw), config, defenses, seed).transcript
        name, paper, metrics = ATTACKS[protocol]
        new = registry.get("attack", name)().evaluate(t, np.random.default_rng(0))
        old = registry.get("attack", name)(**paper).evaluate(t, np.random.default_rng(0))

        row = [_cells(d, metrics) for d in (new.metrics, new.baseline_null, new.baseline_prior, old.metrics)]
        if "blend" in new.reconstruction.meta:  # fedsplit: the self-calibrated weight of the decode
            label += f", w = {new.reconstruction.meta['blend']:.2f}"
        print(f"| {protocol}, {label} ({seed}) | {' / '.join(metrics)} | {' | '.join(row)} |", flush=True)


def _cells(values: dict, metrics: tuple) -> str:
    return " / ".join(f"{values.get(m, float('nan')):.3f}" for m in metrics)


if __name__ == "__main__":
    main()
