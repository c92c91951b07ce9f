from django.db import models


class SessionKind(models.TextChoices):
    MAIN = "main", "Main session"
    SUB = "sub", "Sub-session"


class SessionStatus(models.TextChoices):
    IDLE = "idle", "Idle"
    QUEUED = "queued", "Queued"  # has work, waits for a runner; `status_reason` says why (QueueReason)
    PREPARING = "preparing", "Preparing"
    RUNNING = "running", "Running"
    WAITING_APPROVAL = "waiting_approval", "Waiting for approval"
    COMPRESSING = "compressing", "Compressing"
    INTERRUPTED = "interrupted", "Interrupted"
    FAILED = "failed", "Failed"


class QueueReason(models.TextChoices):
    """Why a Session waits as `queued` (CONTRACT: `session.status.reason`)."""

    CAPACITY = "capacity", "Every worker is busy"
    TENANT_LIMIT = "tenant_limit", "The tenant runs as many Sessions as it may at once"
    QUOTA_EXCEEDED = "quota_exceeded", "A quota is spent"
    PROVIDER_UNAVAILABLE = "provider_unavailable", "The model provider is unavailable"


class InputKind(models.TextChoices):
    MESSAGE = "message", "Message"
    GUIDANCE = "guidance", "Guidance"
    INTERRUPT = "interrupt", "Interrupt"
    APPROVAL_DECISION = "approval_decision", "Approval decision"
    SESSION_EVENT = "session_event", "Session event"


class InputStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    CONSUMED = "consumed", "Consumed"


class TurnReason(models.TextChoices):
    COMPLETED = "completed", "Completed"
    BLOCKED = "blocked", "Blocked"
    MAX_TOKENS = "max_tokens", "Max tokens"
    ABORTED = "aborted", "Aborted"
    ERROR = "error", "Error"
    INTERRUPTED = "interrupted", "Interrupted"


class Role(models.TextChoices):
    USER = "user", "User"
    ASSISTANT = "assistant", "Assistant"
    TOOL = "tool", "Tool"
    SYSTEM = "system", "System"


class PlanTaskStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    IN_PROGRESS = "in_progress", "In progress"
    DONE = "done", "Done"
    SKIPPED = "skipped", "Skipped"


class CallPurpose(models.TextChoices):
    AGENT = "agent", "Agent step"
    TASK_RELATION = "task_relation", "Task relation"
    ORCHESTRATE = "orchestrate", "Orchestration"
    SUMMARY = "summary", "Summary"


class MemoryKind(models.TextChoices):
    ENTITY = "entity", "Entity"
    TOPIC = "topic", "Topic"
    PREFERENCE = "preference", "Preference"
    CONSTRAINT = "constraint", "Constraint"
    DECISION = "decision", "Decision"


class GoalRunStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    PAUSED = "paused", "Paused"
    DONE = "done", "Done"
    STOPPED = "stopped", "Stopped"


class GoalDecision(models.TextChoices):
    CONTINUE = "continue", "Continue"
    DONE = "done", "Done"
    STOP = "stop", "Stop"


class InputRequestStatus(models.TextChoices):
    """An MCP server's elicitation: waiting for a person, then how it ended."""

    PENDING = "pending", "Pending"
    ACCEPTED = "accepted", "Accepted"
    DECLINED = "declined", "Declined"
    CANCELLED = "cancelled", "Cancelled"
    EXPIRED = "expired", "Expired"


class InputRequestAction(models.TextChoices):
    """What the server is told (MCP `ElicitResult.action`); CONTRACT `input.answered`."""

    ACCEPT = "accept", "Accept"
    DECLINE = "decline", "Decline"
    CANCEL = "cancel", "Cancel"


class QuotaPeriod(models.TextChoices):
    """The period a quota's limit applies to; periods start at midnight UTC (a month: its 1st)."""

    DAY = "day", "Day"
    MONTH = "month", "Month"
