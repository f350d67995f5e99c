"""Where an ask's generation time goes on a CPU, alone and in a batch: the prompt's prefill against the decoded tokens.

SmolLM2-135M-Instruct (the bundled LLM, greedy, ``--torch-threads``) generates for ``--batch`` prompts of the answer
prompt's size (a working memory of ``--units`` fact lines and a question), once with 1 new token (the prefill and one
step) and once with ``--new-tokens``, each alone and as one batch, side by side in one run after a warm-up call. It
tells how much ``serve``'s batched asks can gain: a compute-bound prefill is not shared by a batch, decoding steps are.

    python -m bench.bench_ask_prefill [--units 40] [--batch 8] [--new-tokens 32] [--torch-threads 1]

Writes bench/results/ask_prefill.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from qgmem_train.config import BUNDLED_LLM  # noqa: E402
from qgmem_train.llm.local import TransformersLLM  # noqa: E402
from qgmem_train.reports import machine_info  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=40, help="fact lines in each prompt")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ask_prefill.json")
    args = parser.parse_args()
    if min(args.units, args.batch, args.new_tokens, args.torch_threads) < 1:
        parser.error("--units, --batch, --new-tokens and --torch-threads must be at least 1")
    torch.set_num_threads(args.torch_threads)
    llm = TransformersLLM(BUNDLED_LLM, max_new_tokens=args.new_tokens, batch_size=args.batch)
    facts = " ".join(f"[F{i}] Alex said something about the dog Biscuit and the park on day {i}." for i in range(args.units))
    chats = [[{"role": "user", "content": f"Q{k}: {facts} What is the dog called? Answer in JSON."}] for k in range(args.batch)]
    llm.generate(chats[:1], max_new_tokens=2)  # warm: the first call's one-time costs are no prompt's
    machine = machine_info()
    rows = []
    for new in (1, args.new_tokens):
        for size in (1, args.batch):
            load = round(os.getloadavg()[0], 2)
            start = time.perf_counter()
            llm.generate(chats[:size], max_new_tokens=new)
            seconds = time.perf_counter() - start
            rows.append({"new_tokens": new, "batch": size, "seconds": seconds, "seconds_a_prompt": seconds / size, "load_before": load})
    by = {(r["new_tokens"], r["batch"]): r["seconds_a_prompt"] for r in rows}
    split = {size: {"prefill_s": by[1, size], "decode_s": by[args.new_tokens, size] - by[1, size]} for size in (1, args.batch)}
    alone, batched = by[args.new_tokens, 1], by[args.new_tokens, args.batch]
    result = {"machine": machine, "llm": BUNDLED_LLM, "prompt_tokens": llm.count_tokens(llm.render(chats[0])),
              "args": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows, "a_prompt": split, "batched_over_alone": alone / batched}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# An ask's generation on a CPU: prefill against decoding ({machine['cpu']}, {machine['cores']} cores shared with other work, "
        f"load {machine.get('load_average_1m')} at the start, {args.torch_threads} torch thread(s))",
        f"{BUNDLED_LLM}, greedy; prompts of {result['prompt_tokens']} tokens ({args.units} fact lines and a question).",
        "",
        "| new tokens | prompts | seconds | seconds a prompt | load before |",
        "|---|---|---|---|---|",
        *[f"| {r['new_tokens']} | {r['batch']} | {r['seconds']:.2f} | {r['seconds_a_prompt']:.2f} | {r['load_before']} |" for r in rows],
        "",
        *[f"- a prompt in a batch of {size}: prefill {s['prefill_s']:.2f} s, {args.new_tokens - 1} more tokens {s['decode_s']:.2f} s" for size, s in split.items()],
        f"- a batch of {args.batch} over one prompt at a time, a prompt's whole generation: **{result['batched_over_alone']:.2f}x**",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
