"""The paper's prompts (appendix F and F1), verbatim, and the one place that renders them.

The paper prints each prompt on one line; line breaks are restored at its headings and list items,
the words are unchanged. Fields are ``{name}`` placeholders filled by :func:`PromptTemplate.render`,
which leaves every other brace (the JSON examples) untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROMPTS_VERSION = "qgmem-paper-v1"

_FIELD = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class PromptTemplate:
    """A system text plus a user template with named fields."""

    name: str
    system: str
    user: str

    @property
    def fields(self) -> tuple[str, ...]:
        """Placeholder names in the user template, in order of first use."""
        return tuple(dict.fromkeys(_FIELD.findall(self.user)))

    def render(self, **values: object) -> list[dict[str, str]]:
        """Fill every field and return chat messages; a missing or unknown field is a ``KeyError``."""
        missing = [f for f in self.fields if f not in values]
        unknown = [k for k in values if k not in self.fields]
        if missing or unknown:
            raise KeyError(f"prompt {self.name!r}: missing fields {missing}, unknown fields {unknown}")
        user = _FIELD.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), self.user)
        messages = [{"role": "user", "content": user}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        return messages


MEMORY_UNIT_EXTRACTION = PromptTemplate(
    name="memory_unit_extraction",
    system="""You are a long-conversation memory-unit extractor.
# Input
- MEMORY_CONTENT contains a fixed-size sliding window of dialogue lines in this form:
NEW_IN_THIS_WINDOW
[source_id] time: <timestamp> speaker: <message>
OVERLAP_FROM_PREVIOUS_WINDOW
[source_id] time: <timestamp> speaker: <message>
- OVERLAP_FROM_PREVIOUS_WINDOW lines were already included in the previous sliding window. Do not extract memory units from these turns; they serve only as background information for resolving references and ambiguity for NEW_IN_THIS_WINDOW turns.
- NEW_IN_THIS_WINDOW lines are new turns in the current sliding window.
# Task
- Segment the current sliding window into atomic, self-contained memory units. Each memory unit should express exactly one independently retrievable claim: one event, state, plan, preference, or other information.
- If the same turn supports multiple independent claims, output multiple memory units with the same start_turn/end_turn when needed. A unit may cover multiple turns only when those turns are needed to make the single claim complete.
## Evidence bound
- Each memory unit MUST include start_turn and end_turn chosen only from source_ids shown in MEMORY_CONTENT.
## Memory-unit fact_text
- fact_text is compact answer evidence. It must be specific enough to answer a later question without reading MEMORY_CONTENT.
- Resolve pronouns and speaker-relative references into the most specific supported entity, role, object, or group. Prefer real names when available; use `the user` or `the assistant` only when no more specific identity is given.
## Triple extraction
- Output one `triple` for the core claim of each memory unit. It must be directly supported by the unit and include subject, predicate, and object.
# Output format
Return valid JSON only. If there is no retrievable factual content with non-overlap evidence, return {"memory_units": []}.
{ "memory_units": [ { "start_turn": "source id from MEMORY_CONTENT", "end_turn": "source id from MEMORY_CONTENT", "fact_text": "standalone reusable memory-unit text", "triple": { "subject": "…", "predicate": "…", "object": "…" } } ] }""",
    user="""Construct reusable memory units from this fixed sliding-window dialogue segment.
Session id: {session_id}
Turn range: {start_turn}-{end_turn}
Utterance time: {utterance_time}
MEMORY_CONTENT:
{annotated_memory_content}
Output schema: { "memory_units": [ { "start_turn": "…", "end_turn": "…", "fact_text": "…", "triple": { "subject": "…", "predicate": "…", "object": "…" } } ] }""",
)

MEMORY_UNIT_INDEX = PromptTemplate(
    name="memory_unit_index",
    system="""You extract retrieval indexes for memory-unit candidates from one dialogue segment.
Input contains a list of memory units. Each unit has memory_unit_id, utterance_time, fact_text, and evidence_text.
For each memory unit:
1) Extract entities: explicit people, named entities, events, activities, or concrete object/topic keywords needed to retrieve this unit and distinguish it from other memories.
2) Extract locations: concrete places, venues, facilities, cities, countries, or regions where the fact happened. Do not put events or activities in locations unless the text names a physical venue.
3) Extract time: when the described fact happened. Each item is {"start": "…", "end": "…", "granularity": "day|week|month|year"}. Use [] for unknown or vague recency.
Time format:
- For an exact date, set start=end and use the matching granularity.
- For a relative but bounded time, such as "last weekend" or "two weeks before DATE", output a conservative date range rather than a guessed day.
- Distinguish utterance_time and fact time. Resolve relative expressions against the memory unit’s own utterance_time, and do not copy utterance_time itself as the fact time.
- For vague times such as "recently", "lately", "a while ago", or "the other day", output [].
Return valid JSON only:
{ "memory_units": [ { "memory_unit_id": "…", "entities": ["…"], "locations": ["…"], "time": [ { "start": "YYYY-MM-DD|YYYY-MM|YYYY", "end": "YYYY-MM-DD|YYYY-MM|YYYY", "granularity": "day|week|month|year" } ] } ] }""",
    user="""Extract retrieval indexes for these memory units from one dialogue segment.
Session id: {session_id}
Turn range: {start_turn}-{end_turn}
Segment utterance time: {utterance_time}
MEMORY_UNITS: {memory_units_json}""",
)

TRACE_CONSOLIDATION = PromptTemplate(
    name="trace_consolidation",
    system="""You are responsible for turning candidate atomic memories into one concise memory trajectory.
Several memory units may describe the same subject-relation, and later memories can update, refine, repeat, conflict with, or add to earlier memories.
The input items are candidate members of one relation cluster, but some may be irrelevant or only loosely related.
Write one chronological trajectory supported by the memory units:
- keep only items that describe the same evolving subject-relation,
- order the relevant states by memory time,
- include both earlier history and the latest/current supported state.
Use memory order, not world knowledge:
- If time values are `serial-N`, larger N means newer memory.
- If a later memory contradicts an earlier one, describe the later memory as an update.
Return only valid JSON:
{ "trajectory": "compact chronological trajectory including earlier state(s) and the latest supported state" }""",
    user="""Write one memory trajectory for the following relation cluster.
RELATION: {relation_text}
MEMORY_UNITS are sorted from oldest to newest by memory time. Write the trajectory from earlier memory to the latest supported memory, including updates and non-conflicting additions.
{members_json}""",
)

QUERY_INTENT = PromptTemplate(
    name="query_intent",
    system="""You parse a question into retrieval constraints for a long-term memory store.
# Background
- The memory store indexes each memory unit by `entities`, `locations`, and `time`.
- Your output is used to select candidate memories before answer generation.
- The extracted values are used for semantic retrieval, so they should be discriminative rather than general.
# Task
- Read the question and extract retrieval constraints on three axes: `entities`, `locations`, and `time`.
- Keep each list concise and deduplicated.
- If an axis has no useful constraint, return an empty list for that axis.
# Entity and Location
- Extract people, named objects, events, activities, roles, organizations, artifacts, and concrete topic words in `entities`.
- Extract physical or named places, such as Paris, Pacific Northwest, school, gym, museum, beach, or library, in `locations`.
- Do not put answer types in `locations`. For example, "countries", "states", "places", or "where" describe what the answer should find.
- Do not put events or activities in `locations`; keep them in `entities` when they constrain evidence.
# Time
- `time.fact` is for when the remembered fact happened, and `time.utterance` is only for when the conversation happened, such as "in our chat on June 3" or "as mentioned last Tuesday".
- Normalize clear dates as date-only values: `YYYY-MM-DD` for a day or `YYYY-MM-DD..YYYY-MM-DD` for an interval.""",
    user="""Parse this query into retrieval-oriented intent.
Query: {query}
Question time: {question_time}
Use Question time only as the reference for explicit relative time expressions in the query. Do not output it as a time constraint by default.
Output schema: { "entities": ["explicit person, named entity, or topic/object constraint"], "locations": ["concrete place or venue constraint stated in the query"], "time": { "fact": ["YYYY-MM-DD or YYYY-MM-DD..YYYY-MM-DD for when the remembered fact happened"], "utterance": ["YYYY-MM-DD or YYYY-MM-DD..YYYY-MM-DD only when the query explicitly constrains when the conversation happened"] } }""",
)

FINAL_ANSWER = PromptTemplate(
    name="final_answer",
    system="""You answer questions using only the provided memory context.
# Input
- QUESTION is the user’s question.
- QUESTION_TIME, when provided, is the time the question was asked. Use it only to resolve relative time expressions in the question.
- MEMORY_CONTEXT includes:
- Evidence Clusters: retrieved memories grouped by memory-evolution relation. A cluster includes a `trajectory` field describing earlier history and the latest state, together with labeled memory-unit text.
- Facts: labeled structured subject-predicate-object facts.
- Memory-unit `utterance_time` is when the dialogue happened; if memory-unit times use `serial-N`, larger N means newer evidence.
# Task
- Produce the best supported answer to QUESTION.
- Ground the answer only in MEMORY_CONTEXT.
- When a trajectory’s latest state conflicts with older content or older Facts from the same relation, use the trajectory’s latest state as the latest memory-supported evidence.
# Output Format
Think step by step internally, then return valid JSON only:
{ "reasoning_path": "brief chain of reasoning citing labels (MU#/F#) used", "answer": "final answer string only" }""",
    user="""Question: {query}
Question time: {question_time}
Graph: {serialized_graph}
Return only valid JSON with keys reasoning_path and answer, in that order.""",
)

LOCOMO_JUDGE = PromptTemplate(
    name="locomo_judge",
    system="",
    user="""You are an evaluator for long-term conversational question answering. Given a question, a reference answer, and a model prediction, determine whether the prediction correctly answers the question. A prediction should be judged as correct if it is semantically equivalent to the reference answer, even if the wording is different. Minor paraphrases are acceptable. A prediction should be judged as incorrect if it contradicts the reference answer, misses a key entity, event, location, time, or relation, gives an answer that is too vague, or contains unsupported information.
Question: {question}
Reference answer: {reference_answer}
Model prediction: {model_prediction}
Return only a JSON object with two fields: {"judgment": "correct" or "incorrect", "reason": "brief explanation"}""",
)

_LME_HEAD = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes if the response "
    "contains the correct answer. Otherwise, answer no. If the response is equivalent to the correct answer or "
    "contains all the intermediate steps to get the correct answer, you should also answer yes. If the response only "
    "contains a subset of the information required by the answer, answer no."
)
_LME_TAIL = """
Question: {question}
Correct Answer: {answer}
Model Response: {response}
Is the model response correct? Answer yes or no only."""

LONGMEMEVAL_JUDGE = PromptTemplate(name="longmemeval_judge", system="", user=_LME_HEAD + _LME_TAIL)

LONGMEMEVAL_TEMPORAL_JUDGE = PromptTemplate(
    name="longmemeval_temporal_judge",
    system="",
    user=_LME_HEAD
    + " In addition, do not penalize off-by-one errors for the number of days. If the question asks for the number of "
    "days/weeks/months, etc., and the model makes off-by-one errors (e.g., predicting 19 days when the answer is 18), "
    "the model’s response is still correct."
    + _LME_TAIL,
)

LONGMEMEVAL_KNOWLEDGE_UPDATE_JUDGE = PromptTemplate(
    name="longmemeval_knowledge_update_judge",
    system="",
    user="I will give you a question, a correct answer, and a response from a model. Please answer yes if the response "
    "contains the correct answer. Otherwise, answer no. If the response contains some previous information along with "
    "an updated answer, the response should be considered as correct as long as the updated answer is the required answer."
    + _LME_TAIL,
)

LONGMEMEVAL_PREFERENCE_JUDGE = PromptTemplate(
    name="longmemeval_preference_judge",
    system="",
    user="""I will give you a question, a rubric for desired personalized response, and a response from a model. Please answer yes if the response satisfies the desired response. Otherwise, answer no. The model does not need to reflect all the points in the rubric. The response is correct as long as it recalls and utilizes the user’s personal information correctly.
Question: {question}
Rubric: {answer}
Model Response: {response}
Is the model response correct? Answer yes or no only.""",
)

LONGMEMEVAL_ABSTENTION_JUDGE = PromptTemplate(
    name="longmemeval_abstention_judge",
    system="",
    user="""I will give you an unanswerable question, an explanation, and a response from a model. Please answer yes if the model correctly identifies the question as unanswerable. The model could say that the information is incomplete, or some other information is given but the asked information is not.
Question: {question}
Explanation: {answer}
Model Response: {response}
Does the model correctly identify the question as unanswerable? Answer yes or no only.""",
)

PIPELINE_PROMPTS: tuple[PromptTemplate, ...] = (
    MEMORY_UNIT_EXTRACTION,
    MEMORY_UNIT_INDEX,
    TRACE_CONSOLIDATION,
    QUERY_INTENT,
    FINAL_ANSWER,
)
JUDGE_PROMPTS: tuple[PromptTemplate, ...] = (
    LOCOMO_JUDGE,
    LONGMEMEVAL_JUDGE,
    LONGMEMEVAL_TEMPORAL_JUDGE,
    LONGMEMEVAL_KNOWLEDGE_UPDATE_JUDGE,
    LONGMEMEVAL_PREFERENCE_JUDGE,
    LONGMEMEVAL_ABSTENTION_JUDGE,
)
ALL_PROMPTS: dict[str, PromptTemplate] = {p.name: p for p in PIPELINE_PROMPTS + JUDGE_PROMPTS}

# Not one of the paper's prompts: the Qwen3-Reranker input format (its model card), which the paper's
# reranker (Qwen3-Reranker-8B) was trained on. The yes/no reranker renders this template for every
# (question, rerank document) pair and reads p("yes") at the next token. Kept apart from the tuples above.
RERANK_INSTRUCTION = (
    "Given a question about a long-term conversation, judge whether this memory contains evidence that "
    "helps answer the question"
)
RERANK = PromptTemplate(
    name="qwen3_reranker",
    system='Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
    'Note that the answer can only be "yes" or "no".',
    user="""<Instruct>: {instruction}
<Query>: {query}
<Document>: {document}""",
)

# Not one of the paper's prompts: the one retry of a JSON stage whose reply failed its schema (DESIGN:
# "repaired or retried once, then dropped"). Appended after the failed reply as the next user turn.
JSON_RETRY = PromptTemplate(
    name="json_retry",
    system="",
    user="""Your previous reply could not be used: {error}
Reply again with only the JSON object, following the output format given above exactly.""",
)

# Not one of the paper's prompts, and not BEAM's own wording: the paper's appendix has no nugget judge,
# so BEAM's protocol (each rubric nugget scored 0, 0.5 or 1 against the answer, the question's score the
# mean over its nuggets) is written here in this project's words. Kept apart from ALL_PROMPTS.
BEAM_NUGGET_JUDGE = PromptTemplate(
    name="beam_nugget_judge",
    system="",
    user="""You grade one rubric item of a long-term memory benchmark. Given a question, one rubric nugget (a fact or property a complete answer must contain), and a model answer, score how well the answer satisfies the nugget.
Score 1 if the answer fully states the nugget (paraphrases are fine). Score 0.5 if the answer states it only in part, vaguely, or with a minor error. Score 0 if the answer omits it, contradicts it, or only claims not to know.
Question: {question}
Nugget: {nugget}
Model answer: {answer}
Return only a JSON object with two fields: {"score": 0, 0.5 or 1, "reason": "brief explanation"}""",
)


# Not one of the paper's prompts: the project's own question of the alignment stage (docs/alignment.md), asked in
# FINAL_ANSWER with an empty memory context, so the graph tokens are the only source of the target (the local graph's
# facts, one `[F#] subject | predicate | object` line each). Kept apart from ALL_PROMPTS.
ALIGNMENT_INSTRUCTION = (
    "The graph tokens hold a local memory graph. List every fact of that graph as the answer, one line each, "
    "in the form [F#] subject | predicate | object."
)
