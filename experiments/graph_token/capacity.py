"""Step 1 of the graph-token study: can the graph slot carry content at all? No encoder, no graph.

    python -m experiments.graph_token.capacity --out out/graph_token     # over the study's prepared data

For a seeded sample of the study's test questions, free vectors at the graph slot (T = 1 and 10) are optimised for
each question alone, the frozen LLM reading them, against one shared prompt of the same size optimised over all of
them, for three targets: (a) the graph's triples as text with no memory context, (b) the answer with no context,
(c) the answer inside the full prompt (the context cut as in training). Each question's loss is then measured with
its own vectors, with another question's (swapped) and with the shared prompt. Swapping must cost more than
:data:`CAPACITY_NATS` nats a token on (a) and (b) for the slot to carry content; (c) is the most any graph token can
add while the text is present. Results go to ``<out>/capacity/`` (one JSON per target and T, kept, so a killed run
resumes at the next; ``results.json`` and ``results.md``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qgmem_train.reports import commit_text, git_state, machine_info, machine_text, paired_bootstrap
from experiments.graph_token.cli import parser as study_parser
from experiments.graph_token.steps import llm_instrument, part_settings, question_sample, run_step, saved_or_computed, step_folder

log = logging.getLogger("experiments.graph_token.capacity")

CAPACITY_NATS = 0.5
"""The swap cost (nats a token of the target) above which the slot carries a question's own content (the study's bar)."""
TOKEN_COUNTS = (1, 10)


@dataclass(frozen=True)
class Target:
    """What the free vectors are optimised to make likely, and whether the memory context stays in the prompt."""

    key: str
    name: str
    triples: bool
    context: bool


TARGETS = (
    Target("triples", "(a) the graph's triples as text, no context", triples=True, context=False),
    Target("answer", "(b) the answer, no context", triples=False, context=False),
    Target("answer-in-prompt", "(c) the answer inside the full prompt", triples=False, context=True),
)


def target_examples(examples: list[Any], target: Target) -> list[Any]:
    """The examples rewritten for ``target``: the triples text as the answer field for (a), the context dropped for (a)
    and (b). The answer-span loss then scores exactly the target's tokens."""
    from qgmem_train.graph.facts import graph_facts_text

    rewritten = []
    for example in examples:
        if target.triples:
            if not example.graph.num_edges:
                continue
            example = replace(example, answer=graph_facts_text(example.graph), reasoning_path="")
        rewritten.append(example if target.context else replace(example, context=""))
    return rewritten


def initial_vectors(model: Any, shape: tuple[int, ...], seed: int) -> Any:
    """Free vectors started at random rows of the LLM's input embeddings (the scale the LLM reads), trainable."""
    import torch

    table = model.llm.get_input_embeddings().weight.detach()
    rows = torch.randint(0, table.shape[0], (int(torch.tensor(shape[:-1]).prod()),), generator=torch.Generator().manual_seed(seed))
    return table[rows].reshape(shape).clone().float().requires_grad_(True)


def span_losses(model: Any, batch: dict[str, Any], vectors: Any) -> Any:
    """Per-example answer-span loss ``(B,)`` of ``batch`` with ``vectors`` ``(B, T, H)`` at the graph slot."""
    from qgmem_train.graph.readout import GraphTokens

    return model.evaluation_losses(batch, GraphTokens(vectors, None))[1]


def optimise(model: Any, batches: list[dict[str, Any]], vectors: list[Any], steps: int, lr: float) -> None:
    """Adam on ``vectors`` (one tensor per batch, or one shared by every batch) to lower the batches' mean span loss."""
    import torch

    params = list({id(v): v for v in vectors}.values())
    optimiser = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        for batch, v in zip(batches, vectors):
            optimiser.zero_grad()
            span_losses(model, batch, v.expand(len(batch["examples"]), -1, -1)).mean().backward()
            optimiser.step()


def measure(args: argparse.Namespace, target: Target, tokens: int, data_path: Path) -> dict[str, Any]:
    """Own, swapped and shared-prompt span losses per question for ``target`` with ``tokens`` free vectors."""
    import torch

    from experiments.graph_token.arms import Variant
    from experiments.graph_token.training import arm_data_and_module

    variant = Variant("capacity", f"{tokens} free vectors", graph_tokens=tokens)
    data, model = arm_data_and_module(args, variant, 0, data_path)
    model.load_backbone("cpu")
    model.eval()
    examples = question_sample(target_examples(list(data.splits["test"]), target), args.capacity_questions, args.split_seed)
    data.splits["test"] = examples
    batches = list(data.test_dataloader())
    hidden = model.llm.get_input_embeddings().embedding_dim
    own = [initial_vectors(model, (len(b["examples"]), tokens, hidden), i) for i, b in enumerate(batches)]
    optimise(model, batches, own, args.capacity_steps, args.capacity_lr)
    shared = initial_vectors(model, (1, tokens, hidden), len(batches))
    optimise(model, batches, [shared] * len(batches), args.capacity_steps, args.capacity_lr)
    losses: dict[str, dict[str, float]] = {"own": {}, "swapped": {}, "shared": {}}
    with torch.no_grad():
        for batch, v in zip(batches, own):
            ids = [ex.question_id for ex in batch["examples"]]
            size = len(ids)
            for name, vectors in (("own", v), ("swapped", v.roll(1, 0)), ("shared", shared.expand(size, -1, -1))):
                losses[name].update(zip(ids, span_losses(model, batch, vectors).tolist()))
    return {"target": target.key, "tokens": tokens, "questions": len(examples), "losses": losses}


def summarize(record: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Mean losses and the two paired differences of one target and T: swapped − own (content the slot carries) and
    shared − own (what a question's own vectors add over one shared prompt)."""
    losses = record["losses"]
    boot = {"resamples": args.bootstrap_resamples, "seed": args.bootstrap_seed}
    return {
        "target": record["target"], "tokens": record["tokens"], "questions": record["questions"], "wall_s": record["wall_s"],
        "mean": {name: sum(v.values()) / len(v) for name, v in losses.items()},
        "swap_cost": paired_bootstrap(losses["swapped"], losses["own"], **boot),
        "own_vs_shared": paired_bootstrap(losses["shared"], losses["own"], **boot),
    }  # fmt: skip


def verdict(rows: list[dict[str, Any]]) -> tuple[bool | None, str]:
    """Whether swapping costs more than :data:`CAPACITY_NATS` (interval above 0) on targets (a) and (b) at some T; ``None``
    when either was not measured."""
    missing = {"triples", "answer"} - {r["target"] for r in rows}
    if missing:
        return None, f"undecided: target(s) {', '.join(sorted(missing))} not measured"

    def carries(key: str) -> bool:
        return any(r["swap_cost"]["mean_difference"] > CAPACITY_NATS and r["swap_cost"]["ci95"][0] > 0 for r in rows if r["target"] == key)

    passed = carries("triples") and carries("answer")
    text = (f"passes: a question's own vectors carry more than {CAPACITY_NATS} nats a token that another's do not"
            if passed else f"fails: swapping vectors costs at most {CAPACITY_NATS} nats a token on (a) or (b): no capacity in the slot")
    return passed, text


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Data (the study's, reused when there), every target and T (each saved as it ends), the report."""
    import torch

    started = time.perf_counter()
    folder, summary, data_path = step_folder(args, "capacity")
    rows = []
    for target in (t for t in TARGETS if t.key in args.capacity_targets):
        for tokens in TOKEN_COUNTS:
            label = f"{target.key} T={tokens}"
            log.info("[%s] %s: %d steps of free vectors per question and of one shared prompt", label, target.name, args.capacity_steps)
            torch.manual_seed(0)
            part = part_settings(args, args.out.resolve(), questions=args.capacity_questions, steps=args.capacity_steps, lr=args.capacity_lr,
                                 target=target.key, tokens=tokens, split_seed=args.split_seed)  # fmt: skip
            record = saved_or_computed(folder / f"{target.key}-T{tokens}.json", label, lambda: measure(args, target, tokens, data_path), part)
            rows.append(summarize(record, args))
    passed, text = verdict(rows)
    return {
        "step": 1, "question": "can the graph slot carry content?", "passed": passed, "verdict": text,
        "targets": {t.key: t.name for t in TARGETS}, "rows": rows, "split": summary["split"],
        "settings": {"questions": args.capacity_questions, "steps": args.capacity_steps, "lr": args.capacity_lr,
                     "llm": llm_instrument(args.llm), "max_context_tokens": args.max_context_tokens, "batch": args.eval_batch_size},
        "wall_s": round(time.perf_counter() - started, 1), "machine": machine_info(), "git": git_state(),
    }  # fmt: skip


def fmt_diff(cell: dict[str, Any]) -> str:
    """A paired difference with its interval."""
    return f"{cell['mean_difference']:+.3f} [{cell['ci95'][0]:+.3f}, {cell['ci95'][1]:+.3f}]"


def markdown(result: dict[str, Any]) -> str:
    """The step's report: the verdict and, per target and T, the losses and the two differences with intervals."""
    s = result["settings"]
    lines = [
        "# Graph-token study, step 1: can the graph slot carry content?", "",
        f"**{result['verdict']}.** {s['questions']} test questions of {', '.join(result['split']['test'])}, frozen {s['llm']}, "
        f"free vectors at the graph slot optimised {s['steps']} Adam steps (lr {s['lr']}) per question and, over all of them, "
        "one shared prompt of the same size. Answer-span loss in nats a token of the target.", "",
        "| target | T | own | swapped | shared | swapped − own | shared − own | wall (s) |", "|---|---|---|---|---|---|---|---|",
        *(f"| {result['targets'][r['target']]} | {r['tokens']} | {r['mean']['own']:.3f} | {r['mean']['swapped']:.3f} | "
          f"{r['mean']['shared']:.3f} | {fmt_diff(r['swap_cost'])} | {fmt_diff(r['own_vs_shared'])} | {r['wall_s']:.0f} |" for r in result["rows"]),
        "", f"Commit: {commit_text(result['git'])}. Machine: {machine_text(result['machine'])}. Total wall time {result['wall_s']:.0f} s.", "",
    ]  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The study's command line plus this step's settings."""
    p = study_parser()
    p.prog, p.description = "python -m experiments.graph_token.capacity", __doc__.splitlines()[0]
    p.add_argument("--capacity-questions", type=int, default=24, help="test questions sampled for the step")
    p.add_argument("--capacity-steps", type=int, default=30, help="Adam steps on each set of free vectors")
    p.add_argument("--capacity-targets", nargs="+", choices=[t.key for t in TARGETS], default=[t.key for t in TARGETS],
                   help="targets measured (the verdict needs the first two)")
    p.add_argument("--capacity-lr", type=float, default=1e-2, help="learning rate of the free vectors")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run step 1 over ``--out`` (the study's output folder)."""
    return run_step(parser().parse_args(argv), "capacity", run, markdown, ("capacity_questions", "capacity_steps", "eval_batch_size"))


if __name__ == "__main__":
    sys.exit(main())
