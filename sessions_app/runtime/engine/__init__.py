"""SessionEngine: owner of the input queue, goals, status, history, turns, evidence and
context assembly (ARCHITECTURE §1). It never calls the model.

One facade over a small package, split by fact:
- `fencing`: how every change is committed (the Session row lock, the runner's fenced commits);
- `sessions`: Sessions, capabilities and the input queue;
- `turns`: turns and the Session status;
- `history`: messages, their wire form, the slice's request history, tool results;
- `plan`: facts tools change (plan, file changes) and a person's file changes;
- `context`: the system prompt, the assembled request and the model-call record;
- `compaction`: context compression (checkpoints; the summary itself is SummaryService's);
- `recovery`: what a runner that took over from a lost one normalises first.
"""

from .compaction import (
    CompactionPlan,
    abandon_compaction,
    begin_compaction,
    commit_compaction,
    continuity_text,
    fall_back_to_trim,
    plan_compaction,
    record_summary,
    settle_pending_compaction,
    state_budget,
)
from .context import (
    BASE_SYSTEM_PROMPT,
    AssembledRequest,
    CallOutcome,
    begin_model_call,
    end_model_call,
    prompt_blob,
    system_prompt,
)
from .fencing import LeaseLost, RunnerWriter, StaleSlice, lease_duration, locked_session
from .history import (
    GUIDANCE_FRAME,
    INTERRUPTED_CALL_TEXT,
    RequestHistory,
    append_message,
    commit_tool_result,
    has_unanswered_calls,
    record_tool_result,
    stored_calls,
    turn_request,
    unanswered_calls,
    wire_message,
    without_nul,
)
from .plan import file_changed, plan_create, plan_update, record_person_file_change
from .recovery import Recovery, answer_open_calls, recover_lost_runner
from .sessions import (
    InvalidInput,
    add_selected_capabilities,
    archive_session,
    consume_inputs,
    create_session,
    enqueue_input,
    has_pending_work,
    queued_inputs,
    session_capabilities,
    update_session,
    workspace_dir,
    workspace_path,
)
from .turns import (
    ACTIVE_STATUSES,
    STATUS_AFTER_TURN,
    TURN_STARTING_KINDS,
    Boundary,
    TurnProgress,
    end_turn,
    fail_turn,
    fail_without_turn,
    finish_turn,
    input_text,
    save_progress,
    set_status,
    start_turn,
    take_boundary,
)

__all__ = [
    "ACTIVE_STATUSES",
    "BASE_SYSTEM_PROMPT",
    "GUIDANCE_FRAME",
    "INTERRUPTED_CALL_TEXT",
    "STATUS_AFTER_TURN",
    "TURN_STARTING_KINDS",
    "AssembledRequest",
    "CompactionPlan",
    "Boundary",
    "CallOutcome",
    "InvalidInput",
    "LeaseLost",
    "Recovery",
    "RequestHistory",
    "RunnerWriter",
    "StaleSlice",
    "TurnProgress",
    "abandon_compaction",
    "add_selected_capabilities",
    "answer_open_calls",
    "append_message",
    "archive_session",
    "begin_compaction",
    "begin_model_call",
    "commit_compaction",
    "commit_tool_result",
    "continuity_text",
    "consume_inputs",
    "create_session",
    "end_model_call",
    "end_turn",
    "fail_without_turn",
    "has_unanswered_calls",
    "enqueue_input",
    "fall_back_to_trim",
    "fail_turn",
    "file_changed",
    "finish_turn",
    "has_pending_work",
    "input_text",
    "lease_duration",
    "locked_session",
    "plan_compaction",
    "plan_create",
    "plan_update",
    "prompt_blob",
    "queued_inputs",
    "record_person_file_change",
    "record_summary",
    "record_tool_result",
    "recover_lost_runner",
    "save_progress",
    "session_capabilities",
    "set_status",
    "settle_pending_compaction",
    "start_turn",
    "state_budget",
    "stored_calls",
    "system_prompt",
    "take_boundary",
    "turn_request",
    "unanswered_calls",
    "update_session",
    "wire_message",
    "without_nul",
    "workspace_dir",
    "workspace_path",
]
