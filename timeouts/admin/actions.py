"""The admin's actions. Each calls the ORM API one task at a time (never queryset.update(), which
would skip the state machine's conditions), says what happened, and records every task it was
asked to change in the admin log, with the outcome.

Permissions (beyond Django's `view`): `timeouts.cancel_timeouttask` for cancel and run now,
`timeouts.requeue_timeouttask` for requeue. Django only offers (and only runs) an action to a user
who has its permission; each action checks again, so calling one directly cannot bypass that.

With several shards and no shard chosen, an action's queryset reads no database in particular: each
task is read from its shard (a job id names its shard), and then changed there.
"""

from collections import Counter, defaultdict

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied

from timeouts.admin import operations
from timeouts.admin.merged import ShardMerge, across_shards
from timeouts.states import Status
from timeouts.storage import shards
from timeouts.store import clock

# "Select all" can mean millions of rows; an action works on at most this many, one by one.
MAX_TASKS = 1000


def _tasks(modeladmin, request, queryset, permission):
    if not getattr(modeladmin, f"has_{permission}_permission")(request):
        raise PermissionDenied
    if across_shards(queryset):
        tasks = _from_shards(modeladmin, request, queryset)
    else:
        tasks = list(queryset.order_by()[: MAX_TASKS + 1])
    if len(tasks) > MAX_TASKS:
        modeladmin.message_user(
            request, f"Nothing was changed: an action works on at most {MAX_TASKS:,} tasks at once. "
            "Narrow the selection with the filters.", messages.ERROR)
        return None
    return tasks


def _from_shards(modeladmin, request, queryset):
    """The tasks of `queryset`, each read from its shard: the shards of the ticked job ids, or
    every shard for "select all" (the queryset then has no condition on the job ids)."""
    ticked = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
    select_across = modeladmin.action_form.base_fields["select_across"].to_python(request.POST.get("select_across"))
    if select_across or not ticked or not all(pk.isascii() and pk.isdigit() for pk in ticked):
        aliases = shards.aliases()
    else:
        wanted = {shards.alias_of_job(int(pk)) for pk in ticked}
        aliases = [alias for alias in shards.aliases() if alias in wanted]
    merged = ShardMerge(queryset, aliases)
    read = merged.read(lambda on_shard: list(on_shard.order_by()[: MAX_TASKS + 1]))
    for alias in merged.unreadable:
        modeladmin.message_user(request, f"The shard {alias!r} could not be read: its tasks were not changed.",
                                messages.ERROR)
    return [task for tasks in read.values() for task in tasks]


def _log(request, outcomes, action):
    """outcomes: task -> message. One LogEntry per task."""
    by_message = defaultdict(list)
    for task, message in outcomes.items():
        by_message[f"{message} (action: {action})"].append(task)
    for message, tasks in by_message.items():
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=tasks, action_flag=CHANGE,
                                     change_message=message)


def _plural(n, word="task"):
    return f"{n} {word}{'' if n == 1 else 's'}"


def _statuses(tasks):
    counts = Counter(Status(task.status).label for task in tasks)
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))


@admin.action(permissions=["cancel"], description="Cancel selected timeout tasks")
def cancel_selected(modeladmin, request, queryset):
    tasks = _tasks(modeladmin, request, queryset, "cancel")
    if tasks is None:
        return
    done, late, outcomes = [], [], {}
    for task in tasks:
        if task.cancel():
            done.append(task)
            outcomes[task] = "Cancelled"
        else:
            late.append(task)
            outcomes[task] = f"Not cancelled: too late, the task is {Status(task.status).label}"
    _log(request, outcomes, "cancel_selected")
    text = f"Cancelled {_plural(len(done))}."
    if late:
        text += f" {_plural(len(late))} too late to cancel ({_statuses(late)})."
    modeladmin.message_user(request, text, messages.SUCCESS if done and not late else messages.WARNING)


@admin.action(permissions=["requeue"], description="Requeue selected dead or cancelled tasks (due now)")
def requeue_selected(modeladmin, request, queryset):
    tasks = _tasks(modeladmin, request, queryset, "requeue")
    if tasks is None:
        return
    done, skipped, outcomes = [], [], {}
    for task in tasks:
        if task.requeue():
            done.append(task)
            outcomes[task] = "Requeued: pending, due now, attempts reset"
        else:
            skipped.append(task)
            outcomes[task] = f"Not requeued: the task is {Status(task.status).label}, not dead or cancelled"
    _log(request, outcomes, "requeue_selected")
    text = f"Requeued {_plural(len(done))} (pending, due now)."
    if skipped:
        text += f" {_plural(len(skipped))} not requeued: not dead or cancelled ({_statuses(skipped)})."
    modeladmin.message_user(request, text, messages.SUCCESS if done and not skipped else messages.WARNING)


@admin.action(permissions=["cancel"], description="Run selected pending tasks now")
def run_now(modeladmin, request, queryset):
    tasks = _tasks(modeladmin, request, queryset, "cancel")
    if tasks is None:
        return
    # "Now" by the clock of each task's database, read once per database.
    now = {alias: clock.database_now(alias) for alias in {task._state.db for task in tasks}}
    results, outcomes = defaultdict(list), {}
    for task in tasks:
        result = operations.run_now(task, now=now[task._state.db])
        results[result].append(task)
        outcomes[task] = {
            "moved": "Made due now",
            "already due": "Not moved: already due",
            "too late": f"Not moved: too late, the task is {Status(task.status).label}",
        }[result]
    _log(request, outcomes, "run_now")
    text = f"Made {_plural(len(results['moved']))} due now."
    if results["already due"]:
        text += f" {_plural(len(results['already due']))} already due."
    if results["too late"]:
        text += f" {_plural(len(results['too late']))} too late: no longer pending ({_statuses(results['too late'])})."
    level = messages.SUCCESS if len(results["moved"]) == len(tasks) else messages.WARNING
    modeladmin.message_user(request, text, level)
