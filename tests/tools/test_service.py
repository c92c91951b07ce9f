import json
import logging
import threading

import pytest
from jsonschema import Draft202012Validator

from approvals_app.choices import Risk
from tools_app.base import Tool, ToolResult
from tools_app.registry import NATIVE_TOOLS, default_tool_names
from tools_app.service import MAX_RESULT_CHARS, ApprovalRequired, ToolCall, ToolService

WAIT = 5  # seconds; only reached if the code under test is broken


def defaults() -> dict[str, Tool]:
    return {name: NATIVE_TOOLS[name] for name in default_tool_names()}


class EchoTool(Tool):
    name = "echo"
    input_schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    read_only = True

    def run(self, ctx, args):
        return ToolResult(content=args["text"], summary="echoed")


class CrashingTool(Tool):
    name = "crash"
    input_schema = {"type": "object", "additionalProperties": False}

    def run(self, ctx, args):
        raise RuntimeError("boom")


class CallIdTool(Tool):
    name = "who"
    input_schema = {"type": "object"}
    read_only = True

    def run(self, ctx, args):
        return ToolResult(content=ctx.call_id)


class Recorder:
    """Shared, thread-safe event log for the concurrency tests."""

    def __init__(self):
        self.events: list[str] = []
        self._lock = threading.Lock()

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def index(self, event: str) -> int:
        return self.events.index(event)


class ProbeTool(Tool):
    """Records start/end; optionally waits on a barrier (so it cannot finish unless its peers
    run at the same time) and on an event (so completion order can differ from model order)."""

    input_schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}

    def __init__(self, name, recorder, *, read_only, barrier=None, wait_for=None, on_end=None):
        self.name, self.recorder, self.read_only = name, recorder, read_only
        self.risk = Risk.READ if read_only else Risk.WRITE
        self.barrier, self.wait_for, self.on_end = barrier, wait_for, on_end

    def run(self, ctx, args):
        label = args["label"]
        self.recorder.add(f"start:{label}")
        if self.barrier is not None:
            self.barrier.wait(timeout=WAIT)
        if self.wait_for is not None and label in self.wait_for:
            assert self.wait_for[label].wait(timeout=WAIT)
        self.recorder.add(f"end:{label}")
        if self.on_end is not None:
            self.on_end(label)
        return ToolResult(content=f"result {label}")


def call(call_id, name, **args) -> ToolCall:
    return ToolCall(call_id, name, json.dumps(args))


# --- the stages -----------------------------------------------------------------------------


def test_a_successful_call_carries_arguments_summary_and_timing(ctx):
    outcome = ToolService().execute("c1", "echo", '{"text": "hi"}', ctx, {"echo": EchoTool()})

    assert outcome.ok and outcome.stage is None and outcome.error_code is None
    assert (outcome.call_id, outcome.name, outcome.arguments) == ("c1", "echo", {"text": "hi"})
    assert (outcome.content, outcome.summary) == ("hi", "echoed")
    assert isinstance(outcome.duration_ms, int)


def test_unknown_tool_is_refused_at_resolve(ctx):
    outcome = ToolService().execute("c1", "rm_rf", "{}", ctx, defaults())

    assert not outcome.ok
    assert (outcome.stage, outcome.error_code) == ("resolve", "unknown_tool")
    assert "unknown tool 'rm_rf'" in outcome.content and "resolve" in outcome.content
    assert "fs_read" in outcome.content  # tells the model what it can call


def test_known_tool_not_offered_to_this_session_is_refused_at_resolve(ctx, workspace):
    (workspace / "a.txt").write_text("a")

    outcome = ToolService().execute("c1", "fs_delete_files", '{"paths": ["a.txt"]}', ctx, defaults())

    assert (outcome.stage, outcome.error_code) == ("resolve", "tool_unavailable")
    assert "not available in this session" in outcome.content
    assert (workspace / "a.txt").exists()


def test_malformed_json_is_refused_with_the_parse_position(ctx):
    outcome = ToolService().execute("c1", "echo", '{"text": "hi"', ctx, {"echo": EchoTool()})

    assert (outcome.stage, outcome.error_code) == ("parse_arguments", "invalid_json")
    assert outcome.arguments is None
    assert "not valid JSON" in outcome.content and "line 1 column 14" in outcome.content


def test_arguments_must_be_an_object(ctx):
    outcome = ToolService().execute("c1", "echo", '["hi"]', ctx, {"echo": EchoTool()})

    assert (outcome.stage, outcome.error_code) == ("parse_arguments", "invalid_arguments")
    assert "JSON object" in outcome.content


def test_empty_arguments_mean_an_empty_object(ctx):
    outcome = ToolService().execute("c1", "fs_list", "", ctx, defaults())

    assert outcome.ok and outcome.arguments == {}


def test_schema_invalid_arguments_list_each_failing_path(ctx, workspace):
    outcome = ToolService().execute("c1", "fs_write", '{"path": 3, "extra": true}', ctx, defaults())

    assert (outcome.stage, outcome.error_code) == ("validate", "invalid_arguments")
    assert "$.path: 3 is not of type 'string'" in outcome.content
    assert "'content' is a required property" in outcome.content
    assert "'extra' was unexpected" in outcome.content
    assert list(workspace.iterdir()) == []


def test_a_huge_invalid_value_is_quoted_short_so_the_reason_stays_visible(ctx):
    from tools_app.registry import NATIVE_TOOLS

    raw = json.dumps({"text": "y" * 200_000, "kind": "topic"})
    outcome = ToolService().execute(
        "c1", "memory_save", raw, ctx, {"memory_save": NATIVE_TOOLS["memory_save"]}
    )

    assert (outcome.stage, outcome.error_code) == ("validate", "invalid_arguments")
    assert "is too long" in outcome.content and "200000 characters" in outcome.content
    assert len(outcome.content) < 1000


def test_schema_errors_in_nested_items_name_the_item(ctx):
    raw = json.dumps({"updates": [{"id": "1", "status": "finished"}]})

    outcome = ToolService().execute("c1", "plan_update", raw, ctx, defaults())

    assert outcome.stage == "validate"
    assert "$.updates[0].status: 'finished' is not one of" in outcome.content


def test_a_tool_with_an_unusable_schema_is_refused_not_crashed(ctx):
    class BrokenSchema(EchoTool):
        input_schema = {"type": "no-such-type"}

    outcome = ToolService().execute("c1", "echo", '{"text": "x"}', ctx, {"echo": BrokenSchema()})

    assert (outcome.stage, outcome.error_code) == ("validate", "invalid_schema")


def test_an_error_result_from_a_tool_is_not_ok(ctx):
    class Failing(EchoTool):
        def run(self, ctx, args):
            return ToolResult(content="remote said no", is_error=True)

    outcome = ToolService().execute("c1", "echo", '{"text": "x"}', ctx, {"echo": Failing()})

    assert (outcome.ok, outcome.stage, outcome.error_code) == (False, "runtime", "tool_error")
    assert "remote said no" in outcome.content


def test_a_crashing_tool_becomes_an_error_outcome_and_is_logged(ctx, caplog):
    with caplog.at_level(logging.ERROR, logger="tools_app.service"):
        outcome = ToolService().execute("c1", "crash", "{}", ctx, {"crash": CrashingTool()})

    assert not outcome.ok
    assert (outcome.stage, outcome.error_code) == ("runtime", "tool_crashed")
    assert "tool crashed: RuntimeError: boom" in outcome.content
    assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


def test_a_slice_time_limit_inside_a_tool_is_not_taken_for_a_tool_crash(ctx):
    """Celery's soft time limit lands in whatever the slice runs; the runner must see it to end
    the turn with that reason, so ToolService never turns it into a `tool_crashed` result."""
    from celery.exceptions import SoftTimeLimitExceeded

    class Overrunning(CrashingTool):
        def run(self, ctx, args):
            raise SoftTimeLimitExceeded()

    with pytest.raises(SoftTimeLimitExceeded):
        ToolService().execute("c1", "crash", "{}", ctx, {"crash": Overrunning()})


def test_tool_errors_keep_their_stage_and_code(ctx, workspace, host):
    outcome = ToolService().execute(
        "c1", "fs_write", '{"path": "../host/x", "content": "x"}', ctx, defaults()
    )

    assert (outcome.stage, outcome.error_code) == ("resolve_path", "path_escape")
    assert "resolve_path" in outcome.content
    assert sorted(p.name for p in host.iterdir()) == ["secret.txt"]


def test_long_results_are_truncated_with_a_visible_marker(ctx):
    outcome = ToolService().execute(
        "c1", "echo", json.dumps({"text": "x" * 25_000}), ctx, {"echo": EchoTool()}
    )

    assert outcome.ok
    assert outcome.content == "x" * MAX_RESULT_CHARS + "\n…[truncated: 5000 more characters]"


def test_the_tool_sees_its_own_call_id(ctx):
    outcome = ToolService().execute("call_42", "who", "{}", ctx, {"who": CallIdTool()})

    assert outcome.content == "call_42"
    assert ctx.call_id == ""  # the shared context is not mutated


def test_file_tools_through_the_service_report_file_changes(ctx, port):
    service = ToolService()

    service.execute("c1", "fs_write", '{"path": "a.txt", "content": "one"}', ctx, defaults())
    service.execute(
        "c2", "fs_edit", '{"path": "a.txt", "old_text": "one", "new_text": "two"}', ctx, defaults()
    )
    read = service.execute("c3", "fs_read", '{"path": "a.txt"}', ctx, defaults())

    assert read.content == "     1\ttwo"
    assert port.file_changes == [("a.txt", "created"), ("a.txt", "modified")]


# --- approval -------------------------------------------------------------------------------


def test_deny_is_an_error_at_the_approval_stage(ctx, workspace):
    service = ToolService(approval_hook=lambda tool, args, ctx: "deny")

    outcome = service.execute("c1", "fs_write", '{"path": "a.txt", "content": "x"}', ctx, defaults())

    assert (outcome.stage, outcome.error_code) == ("approval", "denied")
    assert not (workspace / "a.txt").exists()


def test_require_approval_raises_for_the_runtime_and_approved_reruns_pass(ctx, workspace):
    def hook(tool, args, ctx):
        return "require_approval" if tool.risk != Risk.READ else "allow"

    service = ToolService(approval_hook=hook)
    raw = '{"path": "a.txt", "content": "x"}'

    with pytest.raises(ApprovalRequired) as caught:
        service.execute("c1", "fs_write", raw, ctx, defaults())
    assert (caught.value.tool.name, caught.value.arguments, caught.value.call_id) == (
        "fs_write",
        {"path": "a.txt", "content": "x"},
        "c1",
    )
    assert not (workspace / "a.txt").exists()

    assert service.execute("c1", "fs_write", raw, ctx, defaults(), approved=True).ok
    assert (workspace / "a.txt").read_text() == "x"


def test_a_broken_approval_hook_fails_closed(ctx, workspace):
    def hook(tool, args, ctx):
        raise KeyError("policy")

    outcome = ToolService(approval_hook=hook).execute(
        "c1", "fs_write", '{"path": "a", "content": ""}', ctx, defaults()
    )

    assert (outcome.stage, outcome.error_code) == ("approval", "approval_error")
    assert not (workspace / "a").exists()


# --- batches and the workspace lease --------------------------------------------------------


def test_read_only_calls_of_a_batch_overlap_and_come_back_in_model_order(ctx):
    recorder = Recorder()
    last_done = threading.Event()
    # All four must be running at once to pass the barrier; call a waits for d to finish,
    # so completion order is not model order.
    probe = ProbeTool(
        "probe",
        recorder,
        read_only=True,
        barrier=threading.Barrier(4),
        wait_for={"a": last_done},
        on_end=lambda label: label == "d" and last_done.set(),
    )
    calls = [call(f"c{i}", "probe", label=label) for i, label in enumerate("abcd")]

    outcomes = list(ToolService().execute_batch(calls, ctx, {"probe": probe}, max_parallel=4))

    assert [o.call_id for o in outcomes] == ["c0", "c1", "c2", "c3"]
    assert [o.content for o in outcomes] == ["result a", "result b", "result c", "result d"]
    assert all(o.ok for o in outcomes)
    starts = [recorder.index(f"start:{x}") for x in "abcd"]
    ends = [recorder.index(f"end:{x}") for x in "abcd"]
    assert max(starts) < min(ends)  # every call started before any finished
    assert recorder.index("end:d") < recorder.index("end:a")


def test_a_write_call_is_a_barrier_between_reads(ctx):
    recorder = Recorder()
    first, second = threading.Barrier(2), threading.Barrier(2)
    barriers = {"r1": first, "r2": first, "r3": second, "r4": second}

    class PairedRead(ProbeTool):
        def run(self, ctx, args):
            self.barrier = barriers[args["label"]]
            return super().run(ctx, args)

    tools = {
        "read": PairedRead("read", recorder, read_only=True),
        "write": ProbeTool("write", recorder, read_only=False),
    }
    calls = [call("1", "read", label="r1"), call("2", "read", label="r2"), call("3", "write", label="w")]
    calls += [call("4", "read", label="r3"), call("5", "read", label="r4")]

    outcomes = list(ToolService().execute_batch(calls, ctx, tools))

    assert [o.call_id for o in outcomes] == ["1", "2", "3", "4", "5"]
    assert all(o.ok for o in outcomes), [o.content for o in outcomes]
    at = recorder.index
    assert max(at("end:r1"), at("end:r2")) < at("start:w")
    assert at("end:w") < min(at("start:r3"), at("start:r4"))


def test_errors_in_a_batch_keep_their_place(ctx):
    calls = [
        call("1", "echo", text="a"),
        ToolCall("2", "nope", "{}"),
        ToolCall("3", "echo", "{bad"),
        call("4", "echo", text="d"),
    ]

    outcomes = list(ToolService().execute_batch(calls, ctx, {"echo": EchoTool()}))

    assert [(o.call_id, o.ok, o.stage) for o in outcomes] == [
        ("1", True, None),
        ("2", False, "resolve"),
        ("3", False, "parse_arguments"),
        ("4", True, None),
    ]


def test_approval_in_a_batch_yields_earlier_results_then_stops(ctx, workspace):
    def hook(tool, args, ctx):
        return "require_approval" if tool.name == "fs_write" else "allow"

    calls = [
        call("1", "fs_list"),
        call("2", "fs_write", path="a.txt", content="x"),
        call("3", "fs_write", path="b.txt", content="y"),
    ]
    batch = ToolService(approval_hook=hook).execute_batch(calls, ctx, defaults())

    assert next(batch).call_id == "1"
    with pytest.raises(ApprovalRequired) as caught:
        next(batch)
    assert caught.value.call_id == "2"
    assert list(workspace.iterdir()) == []


def test_one_writer_per_workspace_at_a_time(ctx, tmp_path):
    recorder = Recorder()
    release, a_started, b_started = threading.Event(), threading.Event(), threading.Event()

    class Holder(Tool):
        name = "hold"
        input_schema = {"type": "object"}

        def run(self, ctx, args):
            recorder.add(f"start:{args['who']}")
            (a_started if args["who"] == "a" else b_started).set()
            if args["who"] == "a":
                assert release.wait(timeout=WAIT)
            recorder.add(f"end:{args['who']}")
            return ToolResult(content="ok")

    service, tools = ToolService(), {"hold": Holder()}
    first = threading.Thread(target=service.execute, args=("1", "hold", '{"who": "a"}', ctx, tools))
    second = threading.Thread(target=service.execute, args=("2", "hold", '{"who": "b"}', ctx, tools))
    first.start()
    assert a_started.wait(timeout=WAIT)
    second.start()
    assert not b_started.wait(timeout=0.2)  # b is queued behind a's lease
    release.set()
    first.join(WAIT)
    second.join(WAIT)

    assert recorder.events == ["start:a", "end:a", "start:b", "end:b"]


def test_writers_in_different_workspaces_do_not_wait_for_each_other(ctx, port, tmp_path):
    from tools_app.base import ToolContext
    from tools_app.workspace import workspace_for

    release, b_done = threading.Event(), threading.Event()

    class Holder(Tool):
        name = "hold"
        input_schema = {"type": "object"}

        def run(self, ctx, args):
            if args["who"] == "a":
                assert release.wait(timeout=WAIT)
            else:
                b_done.set()
            return ToolResult(content="ok")

    other = ToolContext(
        session_id="s2", tenant_id=1, workspace=workspace_for(tmp_path / "ws", "acme", "s2"), port=port
    )
    service, tools = ToolService(), {"hold": Holder()}
    first = threading.Thread(target=service.execute, args=("1", "hold", '{"who": "a"}', ctx, tools))
    first.start()
    try:
        assert service.execute("2", "hold", '{"who": "b"}', other, tools).ok
        assert b_done.is_set()
    finally:
        release.set()
        first.join(WAIT)


# --- the registry ---------------------------------------------------------------------------


def test_native_tools_declare_valid_strict_schemas_and_their_risk():
    assert sorted(NATIVE_TOOLS) == sorted(
        [
            "fs_list",
            "fs_read",
            "fs_write",
            "fs_edit",
            "fs_delete_files",
            "plan_create",
            "plan_update",
            "task_complete",
            "tools_find",
            "tools_select",
            "skills_find",
            "skills_load",
            "memory_save",
            "memory_search",
            "shell_exec",
            "session_delegate",
            "update_goal",
        ]
    )
    for name, tool in NATIVE_TOOLS.items():
        assert tool.name == name and tool.description
        Draft202012Validator.check_schema(tool.input_schema)
        assert tool.input_schema["additionalProperties"] is False, name
        assert tool.openai_schema()["function"]["name"] == name

    risks = {name: (t.risk, t.read_only, t.idempotent) for name, t in NATIVE_TOOLS.items()}
    assert risks["fs_list"] == risks["fs_read"] == (Risk.READ, True, True)
    assert risks["fs_write"][:2] == risks["fs_edit"][:2] == (Risk.WRITE, False)
    assert risks["fs_delete_files"][:2] == (Risk.DESTRUCTIVE, False)
    for name in ("plan_create", "plan_update", "task_complete", "tools_select"):
        assert risks[name][:2] == (Risk.WRITE, False)
    assert risks["tools_find"] == (Risk.READ, True, True)
    assert risks["skills_find"] == risks["memory_search"] == (Risk.READ, True, True)
    # Loading a Skill and saving a memory change facts, and doing either twice changes nothing more.
    assert risks["skills_load"] == risks["memory_save"] == (Risk.WRITE, False, True)
    # The agent's claim about a goal run: the round's last one counts, so saying it twice is once.
    assert risks["update_goal"] == (Risk.WRITE, False, True)
    assert risks["shell_exec"][:2] == (Risk.EXTERNAL, False)
    # What recovery may run again after a lost runner (idempotent), and what it never does.
    assert risks["fs_write"][2] is True  # the whole content: writing it twice is writing it once
    for name in ("fs_edit", "fs_delete_files", "shell_exec", "plan_create", "plan_update", "task_complete"):
        assert risks[name][2] is False, name


def test_default_tools_leave_out_the_destructive_delete():
    assert default_tool_names() == [
        "fs_list",
        "fs_read",
        "fs_write",
        "fs_edit",
        "plan_create",
        "plan_update",
        "task_complete",
        "tools_find",
        "tools_select",
        "skills_find",
        "skills_load",
        "memory_save",
        "memory_search",
    ]
