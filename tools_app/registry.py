"""The native tools by the names the model sees (CONTRACT "Native tools").

Tools are stateless instances shared by every Session and thread; what a Session may call is
decided by the runtime, which hands ToolService the `available` subset.
"""

from __future__ import annotations

from .base import Tool
from .native.delegation import SessionDelegate
from .native.discovery import ToolsFind, ToolsSelect
from .native.files import FsDeleteFiles, FsEdit, FsList, FsRead, FsWrite
from .native.goal import GOAL_TOOL, UpdateGoal
from .native.memory import MemorySave, MemorySearch
from .native.plan import PlanCreate, PlanUpdate, TaskComplete
from .native.shell import ShellExec
from .native.skills import SkillsFind, SkillsLoad

NATIVE_TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        FsList(),
        FsRead(),
        FsWrite(),
        FsEdit(),
        FsDeleteFiles(),
        PlanCreate(),
        PlanUpdate(),
        TaskComplete(),
        ToolsFind(),
        ToolsSelect(),
        SkillsFind(),
        SkillsLoad(),
        MemorySave(),
        MemorySearch(),
        ShellExec(),
        SessionDelegate(),
        UpdateGoal(),
    )
}

# fs_delete_files is destructive: it joins the defaults only once approvals can gate it.
_DEFAULT_TOOL_NAMES = (
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
)


# A MainSession's coordinator tool: the runtime gives it to MainSessions, by their kind, and to
# nothing else; `update_goal` (GOAL_TOOL) only to a goal run's rounds. Neither is ever found,
# selected, orchestrated or reached through a tool set.
DELEGATE_TOOL = "session_delegate"
KIND_BOUND_TOOLS = frozenset({DELEGATE_TOOL, GOAL_TOOL})
__all__ = ["DELEGATE_TOOL", "GOAL_TOOL", "KIND_BOUND_TOOLS", "NATIVE_TOOLS", "default_tool_names"]


def default_tool_names() -> list[str]:
    """Native tools every Session gets without any ToolSet selection."""
    return list(_DEFAULT_TOOL_NAMES)
