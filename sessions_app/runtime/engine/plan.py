"""Facts tools change through the SessionPort (the plan, workspace file changes), and a person's
own file changes. A tool runs inside a runner slice, so its writes are the slice's fenced commits."""

from __future__ import annotations

import logging

from ...choices import PlanTaskStatus
from ...models import Plan, PlanTask
from ..events import emit
from .fencing import RunnerWriter, locked_session

logger = logging.getLogger(__name__)


def plan_create(writer: RunnerWriter, title: str, tasks: list[str]) -> dict:
    with writer.commit() as session:
        plan, created = Plan.objects.get_or_create(
            session_id=session.pk, defaults={"tenant_id": session.tenant_id, "title": title}
        )
        if not created:
            plan.title = title
            plan.version += 1
            plan.save(update_fields=["title", "version", "updated_at"])
            plan.tasks.all().delete()
        PlanTask.objects.bulk_create(
            PlanTask(tenant_id=session.tenant_id, plan=plan, task_id=f"t{i}", position=i, title=t[:500])
            for i, t in enumerate(tasks, start=1)
        )
        data = plan.as_dict()
        emit(session, "plan.updated", {"plan": data})
        return data


def plan_update(writer: RunnerWriter, updates: list[dict]) -> dict:
    with writer.commit() as session:
        plan = Plan.objects.filter(session_id=session.pk).first()
        if plan is None:
            raise ValueError("There is no plan yet; call plan_create first.")
        tasks = {t.task_id: t for t in plan.tasks.all()}
        unknown = [u.get("id") for u in updates if u.get("id") not in tasks]
        if unknown:
            raise ValueError(
                f"Unknown task id(s): {', '.join(map(str, unknown))}; plan has {', '.join(tasks)}."
            )
        for update in updates:
            task = tasks[update["id"]]
            if "status" in update:
                if update["status"] not in PlanTaskStatus.values:
                    raise ValueError(f"Unknown status {update['status']!r}.")
                task.status = update["status"]
            if update.get("title"):
                task.title = update["title"][:500]
            task.save(update_fields=["status", "title"])
        plan.version += 1
        plan.save(update_fields=["version", "updated_at"])
        data = plan.as_dict()
        emit(session, "plan.updated", {"plan": data})
        return data


def file_changed(writer: RunnerWriter, path: str, op: str) -> None:
    with writer.commit() as session:
        emit(session, "file.changed", {"path": path, "op": op})


def record_person_file_change(session_id, path: str, op: str, user) -> None:
    """A person's own upload or delete (files API): announced like a tool's change, and audited
    with who did it (`by`). No lease fence: a person may change files while a turn runs."""
    username = getattr(user, "username", "") or "unknown"
    with locked_session(session_id) as session:
        emit(session, "file.changed", {"path": path, "op": op, "by": username})
    logger.info("workspace file %r %s by %s (session %s)", path, op, username, session_id)
