"""Tracing on a real PostgreSQL and broker (timeouts.tracing): every kind of task stores the trace
context its scheduling ran in (none outside a span), and the dispatch and each attempt's run are
spans linked to it, with the task's attributes and how the attempt ended. The attempts run in this
process, as a worker runs a message; tests/tracing runs them in real workers."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from opentelemetry import trace

import timeouts
from tests.testapp import django_tasks, recorder, tasks
from tests.tracing.exporting import recording
from timeouts import registry
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.publishing import publish
from timeouts.testing import run_due
from timeouts.worker import running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture
def spans():
    with recording() as exporter:
        yield exporter


@pytest.fixture
def django_task_tables():
    """Where the test project's Django tasks record their signals (tests/testapp/django_tasks.py)."""
    with connection.cursor() as cursor:
        cursor.execute(django_tasks.RUNS_TABLE_SQL)
        cursor.execute(django_tasks.SIGNALS_TABLE_SQL)
    yield
    django_tasks.close()


@pytest.fixture
def runs_recorded():
    """Where the DurableTask test tasks record their runs (tests/testapp/tasks.py)."""
    with connection.cursor() as cursor:
        cursor.execute(tasks.CALLS_TABLE_SQL)
    yield
    recorder.close()


@pytest.fixture
def queues(broker):
    broker.flushdb()
    yield broker
    broker.flushdb()


def traceparent(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def stored(biz_type_prefix) -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT trace_context FROM timeouts_task WHERE biz_type ^@ %s ORDER BY job_id",
                       [biz_type_prefix])
        return [value for (value,) in cursor.fetchall()]


def ids(span) -> list:
    context = span.get_span_context()
    return [context.trace_id, context.span_id]


def finished(exporter, name) -> list:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_each_kind_of_task_stores_the_trace_context_it_was_scheduled_in(spans, django_task_tables):
    soon = datetime.now(UTC) + timedelta(minutes=5)
    with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
        timeouts.schedule("test.record", "in-span", delay=60)
        timeouts.schedule("test.record", "keyed", delay=60, on_conflict="replace")
        with transaction.atomic():
            timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": f"bulk-{i}", "at": soon} for i in range(3)])
        tasks.record.apply_async((1,), countdown=60)  # a DurableTask call with an eta
        django_tasks.add.enqueue(2, 3)  # a task of Django's tasks framework
    assert stored("test.record") == [traceparent(checkout)] * 5
    assert stored("celery:") == [traceparent(checkout)]
    assert stored("tasks:") == [traceparent(checkout)]


def test_outside_a_span_nothing_is_stored(spans):
    timeouts.schedule("test.record", "no-span", delay=60)
    timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": "bulk", "delay": 60}])
    assert stored("test.record") == [None, None]


def test_the_dispatch_and_the_run_are_spans_linked_to_the_scheduling_span(spans, queues, starts):
    with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
        task = timeouts.schedule("test.record", "order-7", at=datetime.now(UTC) - timedelta(seconds=1))
    untraced = timeouts.schedule("test.record", "order-8", at=datetime.now(UTC) - timedelta(seconds=1))
    claims = claim_due(10)
    assert {(c.job_id, c.biz_id, c.trace_context) for c in claims} == {
        (task.job_id, "order-7", traceparent(checkout)), (untraced.job_id, "order-8", None)}
    assert publish(claims) == 2
    # Only the task scheduled in a span is linked from the dispatch span: the other would be a trace
    # of one span.
    [dispatch] = finished(spans, "timeouts dispatch test.record")
    assert dispatch.kind == trace.SpanKind.PRODUCER
    assert dict(dispatch.attributes) == {"timeouts.biz_type": "test.record", "timeouts.kind": "handler",
                                         "timeouts.tasks": 1}
    [link] = dispatch.links
    assert [link.context.trace_id, link.context.span_id] == ids(checkout)
    attributes = dict(link.attributes)
    assert attributes.pop("timeouts.lateness_ms") >= 1000  # due a second before its claim
    assert attributes == {"timeouts.biz_id": "order-7", "timeouts.job_id": task.job_id, "timeouts.attempt": 1}

    assert sorted(running.run(claim.fence) for claim in claims) == ["done", "done"]
    runs = {span.attributes["timeouts.job_id"]: span for span in finished(spans, "timeouts run test.record")}
    run = runs[task.job_id]
    assert [[link.context.trace_id, link.context.span_id] for link in run.links] == [ids(checkout)]
    assert run.context.trace_id != checkout.get_span_context().trace_id
    attributes = dict(run.attributes)
    assert attributes.pop("timeouts.lateness_ms") >= 1000
    assert attributes == {"timeouts.biz_type": "test.record", "timeouts.biz_id": "order-7",
                          "timeouts.job_id": task.job_id, "timeouts.attempt": 1, "timeouts.kind": "handler",
                          "timeouts.outcome": "done"}
    assert run.status.status_code == trace.StatusCode.UNSET
    assert runs[untraced.job_id].links == ()  # a run span all the same, linked to nothing


def failing_once_and_for_all(task):
    raise LookupError(f"no order {task.biz_id}")


@pytest.fixture
def fails_for_good():
    timeouts.handler("test.tracing_dead", max_attempts=1)(failing_once_and_for_all)
    yield "test.tracing_dead"
    registry.unregister("test.tracing_dead")


def test_a_failing_handler_s_run_span_records_its_error_and_says_retry_then_dead(spans, fails_for_good, starts):
    with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
        again = timeouts.schedule("test.fail", "a", at=datetime.now(UTC) - timedelta(seconds=1))  # 2 attempts
        dead = timeouts.schedule(fails_for_good, "b", at=datetime.now(UTC) - timedelta(seconds=1))
    for claim in claim_due(10):
        running.run(claim.fence)
    runs = {span.attributes["timeouts.job_id"]: span for span in spans.get_finished_spans()
            if span.name.startswith("timeouts run ")}
    for job_id, outcome, error in ((again.job_id, "retry", "RuntimeError"), (dead.job_id, "dead", "LookupError")):
        run = runs[job_id]
        assert run.attributes["timeouts.outcome"] == outcome
        assert run.status.status_code == trace.StatusCode.ERROR and run.status.description.startswith(error)
        [event] = run.events
        assert event.name == "exception" and event.attributes["exception.type"] == error
        assert [[link.context.trace_id, link.context.span_id] for link in run.links] == [ids(checkout)]


def test_a_durable_call_s_and_a_django_task_s_runs_are_linked_too(spans, django_task_tables, runs_recorded):
    """The one attempt runner serves every kind: here in this process, as run_due() runs them."""
    with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
        tasks.record.apply_async((1,), countdown=60)
        django_tasks.add.enqueue(2, 3)
    assert run_due(until=datetime.now(UTC) + timedelta(minutes=2)) == 2
    runs = {span.attributes["timeouts.kind"]: span for span in spans.get_finished_spans()
            if span.name.startswith("timeouts run ")}
    assert set(runs) == {"DurableTask", "Django task"}
    for run in runs.values():
        assert [[link.context.trace_id, link.context.span_id] for link in run.links] == [ids(checkout)]
        assert run.attributes["timeouts.outcome"] == "done" and run.status.status_code == trace.StatusCode.UNSET
    assert runs["DurableTask"].name == "timeouts run celery:tests.durable.record"
