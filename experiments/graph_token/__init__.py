"""Does the graph token help? Graph-token variants against their controls on ConvoMem conversations, split by conversation.

    python -m experiments.graph_token --out out/graph_token                 # the default run below
    python -m experiments.graph_token --data DIR --out DIR --steps 300      # the specified 300 steps (hours on 2 cores)
    python -m experiments.graph_token.report experiments/graph_token/results/graph_token_600_rerun   # rebuild a saved report

Stages (progress lines for each; rerunning the same command resumes):

1. **Data.** Every case of the ConvoMem-format folder ``--data`` (default ``../shared/data/convomem/test_cases``)
   is read with ``data_prep.convomem``. Cases that share a session id are one conversation (in the test_cases
   layout, ``dataset_<i>.json`` of every category is LoCoMo conversation i). Conversations, never questions,
   are split: one test, one validation, the rest train (``--split-seed``, or name them). Each conversation
   becomes one staged case holding its questions of every category, so data prep (``python -m data_prep``
   with turns units, rule intent, gold targets) builds its memory once instead of once per category file;
   each question's category is kept beside it for the per-category scores. Questions are capped per split
   (a seeded sample of each conversation's questions) before data prep, which activates only those.
2. **Runs.** The frozen SmolLM2 (``--llm``) with, per arm (``--variants``, keys below): each graph design, ``mean1`` (the
   paper's mean readout, T=1), ``mean4`` (T=4), ``edges`` (one token per edge, at most ``--edge-tokens``) and ``query``
   (``--query-tokens`` question-queried pools); for each, ``<design>-soft``, the same number of tokens trained on empty
   graphs (a learned soft prompt; for ``edges`` the mean readout with the cap's worth of tokens, since an empty graph has
   no edges), and ``<design>-shuffled``, the design's trained checkpoint tested with each test question given another
   question's graph from the same conversation (no training); ``<design>-centered`` for ``mean1`` and ``edges``, the
   design with the reference-centered projector (``model.projector.center: reference``), controlled by the design's soft
   prompt and by its own ``-centered-shuffled`` test; ``lora`` (LoRA r=8, no graph) and ``lora+<design>``
   (``--lora-readout``) with its ``lora+<design>-shuffled`` test; ``text`` (the graph's facts in the prompt, no training); ``none`` (no graph, no training).
   Local graphs carry attribute edges (``graph.attribute_edges``; ``--no-attribute-edges`` for the paper's). Trained arms
   run ``--steps`` optimizer steps (seeded, ``deterministic=True``), validate on the validation conversation every
   ``steps / --val-checks`` steps, keep the best checkpoint by ``--monitor`` (the answer-span loss by default) and the last,
   and are tested with the best. Nothing is chosen on the test conversations.
3. **Report.** Per arm: the answer-span loss (the answer field's tokens alone, primary), the whole-target loss,
   valid-JSON rate, F1, BLEU-1 and exact match (mean ± std over seeds), F1 per category, the graph tokens' mean pairwise
   cosine and between-question variance ratio on the test questions; paired bootstrap 95% intervals over test
   questions (per-question values averaged over the seeds both arms ran) of each design against its soft prompt, its shuffled graphs and
   no graph, of each centered design against the design's soft prompt, its own shuffled graphs, the plain design and
   no graph, of LoRA + design against LoRA and its shuffled graphs, and of the text path against no graph, on answer-span loss and on F1.
   Written to ``results.json``, ``results.md`` and PNGs (``loss_curves.png``, ``f1.png``, ``f1_per_category.png``) in ``--out``.

Staging (``--variants`` and the resume make rounds): the screening round is one seed of every arm (the default); then
``--seeds 3 --seeded <best design> <best design>-soft lora+<best design> --lora-readout <best design>`` into the same
``--out`` adds seeds 1 and 2 of those arms (and of their shuffled tests) and rebuilds the report over every finished run.
Rounds whose arms have different seed counts are reported together with ``--report-only``: the widest plan's runs that
exist are reported, the others named as not run, and nothing trains. Where both arms of a comparison have several
seeds, the report also gives each seed's difference and a t interval over the seeds.

Split: ``--test-count`` (2) test conversations, one validation conversation, the rest train (seven LoCoMo
conversations: train on four), every question of the test conversations (``--max-test-questions`` caps them);
``--max-context-tokens`` 600 (the paper's budget; 128 to see what the tokens carry when the text cannot).

Layout of ``--out``: ``data/`` (staged cases, data-prep output, ``trajectories/`` with the split, ``split.json``),
``runs/<variant>-seed<k>/`` (``checkpoints/best-*.ckpt`` and ``last.ckpt``: trainable parameters only, for
``export``; ``logs/version_<n>/`` CSV metrics, a version per call; ``result.json`` with per-question predictions).
A run whose ``result.json`` exists is skipped, so a killed experiment resumes at the run it was in; a run killed in
training or in its test resumes from its ``last.ckpt`` (its last validation; after the last one it goes straight to
its test), keeping the answers it saved, two predict batches at a time, in ``answers.partial.json``. Settings that
change the data or the runs are recorded in ``settings.json``; rerunning with other ones into the same ``--out`` is
refused. ``--max-f1-questions`` may change: the finished runs then answer the questions the new sample adds (a larger
sample holds a smaller one) with the checkpoint each was tested with, saving answers as they come
(``answers.partial.json``), and drop answers outside it; nothing trains again.

Measured speeds (SmolLM2-135M in float32, one torch thread, 2 shared cores, before the prefix cache): a training step of
one example of about 500 tokens 3.9 s; a schema-constrained answer 2.3 s per question in batches of 8; building one
LoCoMo conversation's memory (about 600 turns) 73 s; ``--threads 1`` because two threads ran 8x slower on the shared
machine.

Bad input (no folder, no cases, too few conversations for the split, an unknown arm) is one line on stderr and exit 2.

Modules: ``data`` (conversations, split, data prep), ``arms`` (the arms and their controls), ``training`` (one arm's
run), ``answering`` (answers and losses of the test questions), ``stats`` (means and paired comparisons), ``report``
(results.md and plots), ``cli`` (the command line and the run loop); beside them ``collapse`` and ``structure``, the
measurements of where graph tokens lose the question and of the local graphs' shape. Saved results and their index:
``results/INDEX.md``.
"""
