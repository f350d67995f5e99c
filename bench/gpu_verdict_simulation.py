"""The GPU check's verdict rule on simulated rounds: how often it calls identical variants different, and misses a 10% one.

Each simulated step's device time is ``base × effect × drift × order × noise``: ``drift`` a random walk of the machine
from one variant's round to the next (:data:`DRIFT`), ``order`` a slowdown of whichever variant runs first in a round
(:data:`ORDER_EFFECT`), ``noise`` lognormal per step (:data:`STEP_NOISE`). The rounds are run by the check's own
:func:`gpu_timing.alternate` and judged by its :func:`gpu_timing.compare`; the former rule (the same order every round,
a difference whenever the two variants' round medians do not overlap, no minimum effect) is judged on rounds in the
fixed order for comparison. ``python -m bench.gpu_verdict_simulation`` writes ``results/gpu_verdict_simulation.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.gpu_timing import MIN_EFFECT, MIN_ROUNDS, alternate, compare

DRIFT = 0.02
"""Standard deviation of the machine's log speed change from one variant's round to the next."""
ORDER_EFFECT = 0.03
"""The first variant of a round runs this much slower (a warm clock, caches, allocator state carried over)."""
STEP_NOISE = 0.05
"""Standard deviation of one step's log device time around its round's level."""
STEPS, WARMUP = 8, 2


def simulated_rounds(effect: float, rounds: int, rng: random.Random, alternating: bool = True) -> dict[str, Any]:
    """Rounds of variants ``base`` and ``other`` (``effect`` times slower) under drift, order effect and step noise."""
    state = {"drift": 0.0, "first": True, "slots": 0}

    def before_round(name: str) -> None:
        state["drift"] += rng.gauss(0.0, DRIFT)
        state["first"] = state["slots"] % 2 == 0
        state["slots"] += 1

    def step(factor: float):
        def run(seed: int) -> tuple[float, float]:
            level = 100.0 * factor * math.exp(state["drift"] + (ORDER_EFFECT if state["first"] else 0.0))
            return 1.0, level * math.exp(rng.gauss(0.0, STEP_NOISE))

        return run

    variants = {"base": step(1.0), "other": step(effect)}
    if alternating:
        return alternate(variants, rounds, STEPS, WARMUP, before_round=before_round)
    summary = {name: {"device_ms_round_medians": []} for name in variants}
    for _ in range(rounds):  # the former rule's fixed order
        for name, run in variants.items():
            before_round(name)
            times = [run(seed)[1] for seed in range(WARMUP + STEPS)]
            summary[name]["device_ms_round_medians"].append(statistics.median(times[WARMUP:]))
    return summary


def former_verdict(summary: dict[str, Any]) -> str:
    """The rule before: a difference whenever the variants' round medians do not overlap, however small."""
    a, b = summary["base"]["device_ms_round_medians"], summary["other"]["device_ms_round_medians"]
    return "no difference" if max(a) >= min(b) and max(b) >= min(a) else "difference"


def rates(effect: float, rounds: int, trials: int, seed: int, former: bool = False) -> float:
    """Share of ``trials`` seeded simulations in which the rule reports a difference."""
    rng = random.Random(seed)
    found = 0
    for _ in range(trials):
        summary = simulated_rounds(effect, rounds, rng, alternating=not former)
        verdict = former_verdict(summary) if former else compare(summary, "base", "other", min_rounds=rounds)["verdict"]
        found += verdict == "difference"
    return found / trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for rule, former in (("former (fixed order, overlap)", True), ("paired ratios, order reversed, 5% minimum, 90% interval", False)):
        for rounds in (3, 5, 7):
            false = rates(1.0, rounds, args.trials, args.seed, former)
            miss = 1.0 - rates(1.10, rounds, args.trials, args.seed + 1, former)
            rows.append({"rule": rule, "rounds": rounds, "false_difference": false, "miss_10pct": miss})
    settings = {"trials": args.trials, "seed": args.seed, "drift": DRIFT, "order_effect": ORDER_EFFECT, "step_noise": STEP_NOISE,
                "steps": STEPS, "warmup": WARMUP, "min_effect": MIN_EFFECT, "min_rounds": MIN_ROUNDS}  # fmt: skip
    out = Path(__file__).parent / "results"
    (out / "gpu_verdict_simulation.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")

    table = "\n".join(f"| {r['rule']} | {r['rounds']} | {r['false_difference']:.1%} | {r['miss_10pct']:.1%} |" for r in rows)
    (out / "gpu_verdict_simulation.md").write_text(
        "# The GPU check's verdict rule on simulated rounds\n\n"
        f"{args.trials} seeded simulations a cell (seed {args.seed}): steps with lognormal noise ({STEP_NOISE:.0%} a step, "
        f"{STEPS} timed after {WARMUP} warm-up a round), the machine drifting {DRIFT:.0%} (log standard deviation) between "
        f"consecutive variant rounds, and the first variant of each round {ORDER_EFFECT:.0%} slower. False difference: "
        "identical variants reported different; miss: a true 10% slowdown reported as no difference.\n\n"
        f"| rule | rounds | false difference | miss (10% slower) |\n|---|---|---|---|\n{table}\n\n"
        f"The check gives no verdict under {MIN_ROUNDS} rounds (`too few rounds`); the 3-round rows of the new rule show why.\n\n"
        "Made with `python -m bench.gpu_verdict_simulation` (pure Python, no GPU; seconds on a CPU).\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
