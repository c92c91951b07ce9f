"""The outer loop's pure parts: the task-relation answer's strict validation, Brain's transition
table (CONTRACT), the orchestrate answer's validation, and recall that does not depend on the
order candidates are read or recalls finish in."""

from __future__ import annotations

import json

import pytest

from sessions_app.runtime import orchestrator, understanding
from sessions_app.runtime.understanding import INITIALIZE, RECONCILE, UnderstandingInvalid, parse, transition
from skills_app.catalog import SkillBrief
from tests.runtime.test_skills_in_a_session import make_skill
from tools_app.models import Tool, ToolSet
from tools_app.registry import NATIVE_TOOLS


def answer(**overrides):
    data = {
        "task_relation": "new_task",
        "skill_recall_terms": [],
        "tool_recall_terms": [],
        "memory_recall_terms": [],
    }
    data.update(overrides)
    return json.dumps(data)


def test_a_valid_answer_parses_with_terms_trimmed():
    parsed = parse(answer(skill_recall_terms=[" research ", "markdown guide"], tool_recall_terms=["web"]))
    assert parsed.task_relation == "new_task"
    assert parsed.skill_recall_terms == ("research", "markdown guide")
    assert parsed.as_dict()["tool_recall_terms"] == ["web"]
    fenced = parse("```json\n" + answer(task_relation="uncertain") + "\n```")
    assert fenced.task_relation == "uncertain"


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "not JSON"),
        ("new_task", "not JSON"),
        ("[1]", "not a JSON object"),
        ("[" * 5000 + "]" * 5000, "not JSON"),
        (answer(task_relation="NEW_TASK"), "is not one of"),
        (answer(task_relation=None), "is not one of"),
        (answer(extra=1), "unexpected keys: extra"),
        (json.dumps({"task_relation": "new_task"}), "missing keys"),
        (answer(skill_recall_terms=None), "is null"),
        (answer(tool_recall_terms="web"), "not an array"),
        (answer(memory_recall_terms=[f"t{n}" for n in range(17)]), "17 terms"),
        (answer(skill_recall_terms=["a", " "]), "non-blank string"),
        (answer(skill_recall_terms=[1]), "non-blank string"),
        (answer(skill_recall_terms=["Word", "word"]), "repeats"),
        (answer(skill_recall_terms=["x" * 101]), "longer than 100"),
        (answer() + " trailing words", "not JSON"),
    ],
)
def test_anything_else_is_refused_with_the_reason(text, why):
    with pytest.raises(UnderstandingInvalid, match=why):
        parse(text)


@pytest.mark.parametrize(
    "relation, phase_goal, session_goal, expected",
    [
        # No phase goal yet: whatever the relation, the message is the phase goal (initialize).
        ("out_of_scope", "", "", ("msg", "msg", INITIALIZE)),
        ("continue_current", "", "S", ("msg", None, INITIALIZE)),
        ("new_task", "P", "S", ("msg", None, INITIALIZE)),
        ("change_within_session", "P", "S", ("msg", None, RECONCILE)),
        ("continue_current", "P", "S", (None, None, None)),
        ("out_of_scope", "P", "S", (None, None, None)),
        ("uncertain", "P", "S", (None, None, None)),
        # The session goal is set once: only when it is still empty.
        ("new_task", "P", "", ("msg", "msg", INITIALIZE)),
    ],
)
def test_the_transition_table(relation, phase_goal, session_goal, expected):
    step = transition(relation, text="  msg  ", phase_goal=phase_goal, session_goal=session_goal)
    assert (step.phase_goal, step.session_goal, step.mode) == expected


def test_every_relation_of_the_contract_is_handled():
    assert set(understanding.RELATIONS) == {
        "new_task",
        "continue_current",
        "change_within_session",
        "out_of_scope",
        "uncertain",
    }


CANDIDATES = orchestrator.Candidates(
    skills=[SkillBrief(1, "research-guide", "Research", 1)],
    toolsets=[{"kind": "toolset", "name": "docs", "description": "", "tools": []}],
    tools=[{"kind": "tool", "name": "convert", "description": "", "risk": "write"}],
)


def test_a_selection_names_candidates_only():
    chosen = orchestrator.parse(
        json.dumps({"skills": ["research-guide"], "toolsets": ["docs"], "tools": ["convert", "convert"]}),
        CANDIDATES,
    )
    assert chosen.as_dict() == {"skills": ["research-guide"], "toolsets": ["docs"], "tools": ["convert"]}
    assert (
        orchestrator.parse('{"skills": [], "toolsets": [], "tools": []}', CANDIDATES).as_dict()["skills"]
        == []
    )
    for bad, why in [
        ('{"skills": ["docs"], "toolsets": [], "tools": []}', "not a candidate"),
        ('{"skills": [], "toolsets": [], "tools": [], "models": ["gpt"]}', "unexpected keys"),
        ('{"skills": []}', "missing keys"),
        ('{"skills": [1], "toolsets": [], "tools": []}', "array of names"),
        ("sure!", "not JSON"),
    ]:
        with pytest.raises(orchestrator.SelectionInvalid, match=why):
            orchestrator.parse(bad, CANDIDATES)


class TiedScorer:
    """Every candidate scores the same: only the tie-break decides the order."""

    def score(self, query_terms, documents):
        return [1.0] * len(documents)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("parallel", [True, False])
def test_recall_is_the_same_whatever_order_rows_come_in(tenant_a, settings, parallel):
    settings.XAGENT_RECALL_PARALLEL = parallel
    settings.XAGENT_RECALL_SCORER = "tests.runtime.test_outer_loop_units.TiedScorer"
    for name in ("zeta-guide", "alpha-guide", "mid-guide"):
        make_skill(tenant_a, name, f"{name} for research")
    shell = Tool.objects.get(tenant=None, name="shell_exec")
    for name in ("z-tools", "a-tools"):
        ToolSet.objects.create(tenant=tenant_a, name=name, description="convert documents").tools.add(shell)
    terms = understanding.TaskUnderstanding("new_task", ("research",), ("convert",), ())
    # What the Session has (here: every native tool) is never a candidate.
    has = {"available_tools": list(NATIVE_TOOLS)}
    first = orchestrator.recall(tenant_id=tenant_a.pk, understanding=terms, **has)
    assert [s.name for s in first.skills] == ["alpha-guide", "mid-guide", "zeta-guide"]
    assert [t["name"] for t in first.toolsets] == ["a-tools", "z-tools"]
    assert first.tools == []
    again = orchestrator.recall(
        tenant_id=tenant_a.pk,
        understanding=terms,
        loaded_skills=["mid-guide"],
        attached_toolsets=["a-tools"],
        **has,
    )
    assert [t["name"] for t in again.toolsets] == ["z-tools"]
    assert [s.name for s in again.skills] == ["alpha-guide", "zeta-guide"]
    # Candidates are truncated per kind, deterministically.
    for n in range(orchestrator.MAX_SKILL_CANDIDATES + 3):
        make_skill(tenant_a, f"extra-{n:02d}", "more research")
    many = orchestrator.recall(tenant_id=tenant_a.pk, understanding=terms, **has)
    assert len(many.skills) == orchestrator.MAX_SKILL_CANDIDATES
    assert [s.name for s in many.skills] == sorted(s.name for s in many.skills)
    assert "score" not in json.dumps(many.for_prompt())
