"""The arms of the graph-token study: each graph design with its controls (soft prompt, shuffled graphs, centered
projector, LoRA), and the shuffled-graph test's derangement."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from qgmem_train.errors import InputError


@dataclass(frozen=True)
class Variant:
    """One arm of the experiment: how the module is configured and whether it trains."""

    key: str
    name: str
    graph_tokens: int = 0
    graph_readout: str = "mean"
    text_path: bool = False
    lora_r: int = 0
    graph_center: str = "none"
    """The projector's centering (``model.projector.center``)."""
    empty_graphs: bool = False
    """Train and evaluate on empty graphs (the learned soft-prompt control)."""
    shuffled_of: str | None = None
    """Test the checkpoint of this arm (same seed) with each test question given another question's graph; no training."""

    @property
    def trained(self) -> bool:
        """Whether the variant has trainable parameters (else it is only validated and tested)."""
        return self.shuffled_of is None and (self.graph_tokens > 0 or self.lora_r > 0)


GRAPH_ARMS = ("mean1", "mean4", "edges", "query")
"""The trained graph designs; each has a same-size soft prompt (``<arm>-soft``) and a shuffled-graph test (``<arm>-shuffled``)."""
CENTERED_ARMS = ("mean1", "edges")
"""The designs also run with the reference-centered projector (``<arm>-centered``, tested shuffled as ``<arm>-centered-shuffled``)."""


def variants(edge_tokens: int = 10, query_tokens: int = 4, lora_readout: str = "edges") -> dict[str, Variant]:
    """Every arm of the experiment, by key, in run order (a shuffled-graph arm after the arm whose checkpoint it tests).

    The soft prompt of the ``edges`` readout is the mean readout with ``edge_tokens`` tokens on empty graphs: per-edge
    tokens of an empty graph are none at all, so its same-size prompt is the cap's worth of learned tokens.
    """
    designs = {
        "mean1": Variant("mean1", "graph token T=1 (mean readout, the paper's)", graph_tokens=1),
        "mean4": Variant("mean4", "graph tokens T=4 (mean readout)", graph_tokens=4),
        "edges": Variant("edges", f"edge tokens, at most {edge_tokens} (edges readout)", graph_tokens=edge_tokens, graph_readout="edges"),
        "query": Variant("query", f"query tokens T={query_tokens} (query readout)", graph_tokens=query_tokens, graph_readout="query"),
    }
    arms: dict[str, Variant] = {}
    for key, design in designs.items():
        soft_readout = "mean" if design.graph_readout == "edges" else design.graph_readout
        arms[key] = design
        arms[f"{key}-soft"] = Variant(f"{key}-soft", f"soft prompt T={design.graph_tokens} for {key} (empty graphs)",
                                      graph_tokens=design.graph_tokens, graph_readout=soft_readout, empty_graphs=True)  # fmt: skip
        arms[f"{key}-shuffled"] = replace(design, key=f"{key}-shuffled", name=f"{design.name}, shuffled test graphs", shuffled_of=key)
        if key in CENTERED_ARMS:
            centered = replace(design, key=f"{key}-centered", name=f"{design.name}, reference-centered", graph_center="reference")
            arms[centered.key] = centered
            arms[f"{centered.key}-shuffled"] = replace(centered, key=f"{centered.key}-shuffled", name=f"{centered.name}, shuffled test graphs",
                                                       shuffled_of=centered.key)  # fmt: skip
    lora_design = designs[lora_readout]
    arms["lora"] = Variant("lora", "LoRA r=8, no graph", lora_r=8)
    lora_graph = arms[f"lora+{lora_readout}"] = replace(lora_design, key=f"lora+{lora_readout}", name=f"LoRA r=8 + {lora_design.name}", lora_r=8)
    arms[f"{lora_graph.key}-shuffled"] = replace(lora_graph, key=f"{lora_graph.key}-shuffled", name=f"{lora_graph.name}, shuffled test graphs",
                                                 shuffled_of=lora_graph.key)  # fmt: skip
    arms["text"] = Variant("text", "text path: graph facts in the prompt, no training", text_path=True)
    arms["none"] = Variant("none", "no graph, no training")
    return arms


def shuffled_graphs(examples: list[Any], seed: int) -> list[Any]:
    """Each example with the local graph of another example of the same case (conversation), never its own: the
    derangement fit's shuffle gap uses (:func:`qgmem_train.graph.shuffle_gap.graph_donors`). A case with a single
    example has no other graph to give: refused."""
    from qgmem_train.graph.shuffle_gap import graph_donors

    sizes = Counter(example.case_id for example in examples)
    lone = sorted(case_id for case_id, size in sizes.items() if size < 2)
    if lone:
        raise InputError(lone[0], "one test question only: no other question's graph to shuffle in")
    donors = graph_donors([example.case_id for example in examples], seed)
    return [replace(example, graph=examples[donor].graph) for example, donor in zip(examples, donors)]
