"""System checks (`manage.py check`, and before runserver, migrate, ...): the configuration
mistakes that would otherwise show up later as tasks that never run.

| id | level | what |
|---|---|---|
| timeouts.E001 | error | a database that holds timeouts_task is not PostgreSQL |
| timeouts.E002 | error | USE_TZ is off |
| timeouts.E003 | error | the TIMEOUTS setting is invalid (unknown key, wrong type or range, channel > 63 bytes) |
| timeouts.E004 | error | NOTIFY_HORIZON is not shorter than one partition |
| timeouts.E005 | error | a handler's queue is not in the Celery app's task_queues, and missing queues are not created |
| timeouts.W001 | warning | no Celery app is loaded with Django |
| timeouts.W002 | warning | the Celery app's beat_schedule lacks timeouts.scan or timeouts.maintain |
| timeouts.W003 | warning | a handler's queue is not among the Celery app's task_queues |
| timeouts.W004 | warning | handlers' ORM queries open a connection per Celery task (no DB reuse, CONN_MAX_AGE 0) |
| timeouts.W005 | warning | the Celery app is not wired by timeouts.celery.setup(), or a setting it sets differs |
| timeouts.W006 | warning | a shard other than "default" lacks migrations or a partition for now (`check --database`) |
| timeouts.W007 | warning | ATOMIC_REQUESTS leaves shards outside a view's transaction: its tasks there are refused |
"""

from datetime import timedelta
from types import SimpleNamespace

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router

from timeouts import conf, registry
from timeouts.celery import BEAT_QUEUE, BEAT_TASKS, is_set_up
from timeouts.dispatch.brokers import is_amqp


def register_checks() -> None:
    """Register the checks with Django's check framework (TimeoutsConfig.ready() calls this)."""
    for check in (check_database, check_time_zone, check_settings, check_transactional_scheduling, check_celery):
        register(check)
    register(check_shards, Tags.database)  # it connects: Django runs it only when databases are checked


PARTITION_SECONDS = {"hour": 3600, "day": 86400, "week": 7 * 86400, "month": 28 * 86400}  # month: its shortest


def check_database(app_configs=None, **kwargs):
    from timeouts.models import TimeoutTask

    problems = []
    for alias in connections:
        if not router.allow_migrate_model(alias, TimeoutTask):
            continue
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            problems.append(Error(
                f"timeouts needs PostgreSQL, but the database {alias!r} (which would hold timeouts_task) is {vendor}.",
                hint="Use django.db.backends.postgresql (PostgreSQL 15 or newer, psycopg 3.2.10 or newer): the task "
                     "table is partitioned and claimed with FOR UPDATE SKIP LOCKED and LISTEN/NOTIFY.",
                id="timeouts.E001"))
    return problems


def check_time_zone(app_configs=None, **kwargs):
    if settings.USE_TZ:
        return []
    return [Error(
        "timeouts needs USE_TZ = True.",
        hint="Task times are aware datetimes stored in UTC; with USE_TZ off Django would read and write naive "
             "local times and tasks would run at the wrong moment.",
        id="timeouts.E002")]


def check_settings(app_configs=None, **kwargs):
    given = getattr(settings, "TIMEOUTS", {}) or {}
    if not isinstance(given, dict):
        return [Error(f"The TIMEOUTS setting must be a dict, got {type(given).__name__}.", id="timeouts.E003")]
    problems = [Error(f"TIMEOUTS setting: unknown key {key!r}.",
                      hint=f"Known keys: {', '.join(sorted(conf.KEYS))}.", id="timeouts.E003")
                for key in sorted(set(given) - conf.KEYS)]
    values = SimpleNamespace(**{**{key: getattr(conf.Settings, key) for key in conf.KEYS},
                                **{key: value for key, value in given.items() if key in conf.KEYS}})
    problems += [Error(f"TIMEOUTS setting: {message}.", hint="See the settings reference (docs: reference/settings).",
                       id="timeouts.E003")
                 for message in conf._problems(values)]
    partition = PARTITION_SECONDS.get(values.PARTITION_INTERVAL)
    horizon = values.NOTIFY_HORIZON
    if partition and isinstance(horizon, (int, float)) and not isinstance(horizon, bool) and horizon >= partition:
        problems.append(Error(
            f"TIMEOUTS setting: NOTIFY_HORIZON ({horizon} s) must be shorter than one partition "
            f"(PARTITION_INTERVAL {values.PARTITION_INTERVAL!r}: {timedelta(seconds=partition)}).",
            hint="The horizon says which new tasks are due soon enough to wake the dispatchers: keep it to "
                 "seconds or minutes.",
            id="timeouts.E004"))
    return problems


def check_shards(app_configs=None, databases=None, **kwargs):
    """Shards that could not hold a task now. Django itself reports the default database's
    unapplied migrations; the other shards' only timeouts knows of. A database check: it connects,
    so Django runs it only when asked for databases (`check --database`, `migrate`)."""
    try:
        aliases = conf.get_settings().SHARDS
    except Exception:  # check_settings reports it
        return []
    problems = []
    for alias in aliases:
        if alias == DEFAULT_DB_ALIAS or alias not in (databases or ()) or alias not in connections:
            continue
        try:
            missing = _unapplied_migrations(alias)
            uncovered = not missing and not _has_partition_for_now(alias)
        except DatabaseError as exc:
            problems.append(Warning(f"timeouts cannot read the shard {alias!r}: {exc}".strip(),
                                    id="timeouts.W006"))
            continue
        if missing:
            problems.append(Warning(
                f"The shard {alias!r} lacks timeouts' migrations {', '.join(missing)}: tasks routed to it fail.",
                hint=f"Run: manage.py migrate --database {alias}", id="timeouts.W006"))
        elif uncovered:
            problems.append(Warning(
                f"The shard {alias!r} has no partition for the current time: its tasks wait in the DEFAULT "
                f"partition.", hint=f"Run: manage.py timeouts_partitions --database {alias}, and the "
                                    "timeouts.maintain beat task, which maintains every shard.",
                id="timeouts.W006"))
    return problems


def check_transactional_scheduling(app_configs=None, **kwargs):
    """ATOMIC_REQUESTS puts every view inside a transaction on its database. With several shards, a
    view's task that goes to a shard outside that transaction is refused (ShardOutsideTransaction),
    so a configuration that sends tasks there is a view that fails, not a view that schedules."""
    try:
        settings_ = conf.get_settings()
    except Exception:  # check_settings reports it
        return []
    shards = tuple(settings_.SHARDS)
    if shards == (DEFAULT_DB_ALIAS,):
        return []
    # A host's other databases are none of timeouts' business: only default's and the shards' count.
    counted = [alias for alias in dict.fromkeys((DEFAULT_DB_ALIAS, *shards)) if alias in connections]
    atomic = [alias for alias in counted if connections.settings[alias].get("ATOMIC_REQUESTS")]
    if not atomic:
        return []
    held = [alias for alias in shards if alias in atomic]
    outside = [alias for alias in shards if alias not in atomic]
    names = ", ".join(repr(alias) for alias in atomic)
    if not held:
        return [Warning(
            f"ATOMIC_REQUESTS is on for {names}, which holds none of TIMEOUTS['SHARDS']: every task a view "
            "schedules (schedule(), bulk_schedule(), a DurableTask call, a Django task) is refused with "
            "ShardOutsideTransaction, since it would commit apart from the view's transaction.",
            hint="Schedule in transaction.on_commit(), mark the views that schedule "
                 "@transaction.non_atomic_requests, or make the database of your views' transactions a shard.",
            id="timeouts.W007")]
    if settings_.SHARD_ROUTER is not None or not outside:
        return []
    return [Warning(
        f"ATOMIC_REQUESTS is on for {names} but not for the shards {', '.join(repr(a) for a in outside)}, and no "
        "SHARD_ROUTER is set: a view's schedule() or bulk_schedule() whose biz_id hashes to one of those is refused "
        "with ShardOutsideTransaction, since it would commit apart from the view's transaction.",
        hint="Set TIMEOUTS['SHARD_ROUTER'] to a function that keeps tasks on the database of your views' "
             "transactions, or schedule in transaction.on_commit() (docs: howto/shards).",
        id="timeouts.W007")]


def _unapplied_migrations(alias) -> list[str]:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == "timeouts"]
    return [migration.name for migration, _ in executor.migration_plan(targets)]


def _has_partition_for_now(alias) -> bool:
    from timeouts.storage.partitions import list_partitions
    from timeouts.store.queries import fetch_one

    connection = connections[alias]
    now = fetch_one("database_now", using=connection)["now"]
    return any(partition.overlaps(now, now + timedelta(microseconds=1)) for partition in list_partitions(connection))


def _celery_app():
    from celery import current_app

    app = current_app._get_current_object()  # the app behind Celery's proxy: Proxy's documented way
    return None if app.main in (None, "default") else app


def check_celery(app_configs=None, **kwargs):
    try:
        app = _celery_app()
    except Exception as exc:  # noqa: BLE001  a broken Celery configuration: say so, don't crash every command
        return [Warning(f"timeouts could not load the Celery app: {exc!r}", id="timeouts.W001")]
    if app is None:
        return [Warning(
            "No Celery app is loaded with Django, so the timeouts tasks cannot be checked (and may not be bound "
            "to your app).",
            hint="Follow Celery's Django recipe: import your app in your project's __init__.py "
                 "(from .celery import app as celery_app).",
            id="timeouts.W001")]
    try:
        app.finalize(auto=True)  # runs on_after_finalize, where hosts add the beat entries
        return _check_setup(app) + _check_beat(app) + _check_queues(app) + _check_connection_reuse(app)
    except Exception as exc:  # noqa: BLE001  as above
        return [Warning(f"timeouts could not read the Celery app's configuration: {exc!r}", id="timeouts.W001")]


def _check_beat(app):
    schedule = app.conf.beat_schedule or {}
    present = {entry.get("task") for entry in schedule.values() if isinstance(entry, dict)}
    missing = [task for task in BEAT_TASKS if task not in present]
    if not missing:
        return []
    return [Warning(
        f"The Celery app {app.main!r} has no beat entry for {' and '.join(missing)}: without the scan, tasks "
        "only run while a dispatcher runs, and without maintenance no new partition is created.",
        hint="Call timeouts.celery.setup(app), or merge timeouts.celery.beat_schedule() into "
             "app.conf.beat_schedule. If your beat entries live in a database scheduler, create them there and add "
             "'timeouts.W002' to SILENCED_SYSTEM_CHECKS.",
        id="timeouts.W002")]


def _queue_names(queues):
    if isinstance(queues, dict):
        return set(queues)
    return {getattr(queue, "name", queue) for queue in queues}


def _check_queues(app):
    declared, create_missing = app.conf.task_queues, app.conf.task_create_missing_queues
    names = _queue_names(declared or [app.conf.task_default_queue])
    # setup() declares the default queue and the beat tasks' own when the host declares none.
    if create_missing and (not declared or names == {app.conf.task_default_queue, BEAT_QUEUE}):
        return []  # no queue of the host's own: they are created when first used
    problems = []
    # One message per missing queue, naming every handler on it (each queue of Django's tasks
    # framework that timeouts serves is a handler too: tasks_queues.py).
    missing = {}
    for handler in sorted(registry.registered().values(), key=lambda h: h.biz_type):
        if handler.queue is not None and handler.queue not in names:
            missing.setdefault(handler.queue, []).append(repr(handler.biz_type))
    for queue, biz_types in missing.items():
        handlers = f"Handler {biz_types[0]} runs" if len(biz_types) == 1 else f"Handlers {', '.join(biz_types)} run"
        known = ", ".join(sorted(names))
        if create_missing:
            problems.append(Warning(
                f"{handlers} on queue {queue!r}, which is not in the Celery app's task_queues ({known}).",
                hint=f"Add it to task_queues and start a worker with -Q {queue}; as it is, Celery creates the queue "
                     "on first use and only a worker started with that -Q will consume it.",
                id="timeouts.W003"))
        else:
            problems.append(Error(
                f"{handlers} on queue {queue!r}, which the Celery app does not declare "
                f"(task_queues: {known}) and task_create_missing_queues is off: its tasks cannot be published.",
                hint=f"Add {queue!r} to task_queues, or change the handler's queue=.",
                id="timeouts.E005"))
    return problems


def _check_connection_reuse(app):
    """Celery's Django fixup closes every database connection before and after each task unless
    CELERY_DB_REUSE_MAX is set (since Celery 5.6 whatever CONN_MAX_AGE says). Timeouts' own
    statements do not care (a worker runs them on a connection of its own: own_connection.py), but a
    handler's ORM queries then open a new PostgreSQL connection for every task."""
    from timeouts.models import TimeoutTask

    causes = [] if app.conf.get("CELERY_DB_REUSE_MAX") else ["CELERY_DB_REUSE_MAX is unset"]  # the fixup's lookup
    causes += [f"CONN_MAX_AGE is 0 for the database {alias!r}" for alias in connections
               if router.allow_migrate_model(alias, TimeoutTask)
               and not connections.settings[alias].get("CONN_MAX_AGE")]
    if not causes:
        return []
    return [Warning(
        f"{' and '.join(causes)}: Celery closes Django's database connections around every task, so a handler "
        "that uses the ORM opens a new PostgreSQL connection per task (several milliseconds). timeouts' own "
        "statements are not affected.",
        hint="If your handlers query the database, set CELERY_DB_REUSE_MAX (e.g. 1000) and CONN_MAX_AGE > 0 with "
             "CONN_HEALTH_CHECKS = True; otherwise add 'timeouts.W004' to SILENCED_SYSTEM_CHECKS.",
        id="timeouts.W004")]


def _check_setup(app):
    """What timeouts.celery.setup() applies, and a host's settings may have overridden."""
    if not is_set_up(app):
        return [Warning(
            f"The Celery app {app.main!r} was not wired with timeouts.celery.setup(app).",
            hint="Call timeouts.celery.setup(app) in your celery.py, after config_from_object(). If you wire "
                 "Celery yourself on purpose, add 'timeouts.W005' to SILENCED_SYSTEM_CHECKS.",
            id="timeouts.W005")]
    conf, problems = app.conf, []
    if "json" not in conf.accept_content:
        problems.append(Warning(
            f"The Celery app's accept_content ({list(conf.accept_content)}) refuses JSON: workers will reject "
            "timeouts' messages.", hint="Add 'json' to accept_content.", id="timeouts.W005"))
    if conf.worker_prefetch_multiplier != 1:
        problems.append(Warning(
            f"worker_prefetch_multiplier is {conf.worker_prefetch_multiplier}: a worker process reserves that many "
            "messages, so a due task can wait behind a busy process's handler while another process is idle.",
            hint="Set worker_prefetch_multiplier = 1 for the workers that run timeouts' queues.", id="timeouts.W005"))
    if is_amqp(conf.broker_url) and not (conf.broker_transport_options or {}).get("confirm_publish"):
        problems.append(Warning(
            "Publisher confirms are off on RabbitMQ: a message the broker never took can be lost without an error.",
            hint="Set broker_transport_options = {'confirm_publish': True}.", id="timeouts.W005"))
    return problems
