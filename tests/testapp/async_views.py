"""An async view over timeouts' async API, as a host's view would call it: the tests of that API
send it requests through Django's async request path (tests/integration/test_async_api.py)."""

import json

from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

import timeouts
from timeouts.models import TimeoutTask

CALLS = {"schedule": timeouts.aschedule, "bulk_schedule": timeouts.abulk_schedule, "cancel": timeouts.acancel,
         "reschedule": timeouts.areschedule, "requeue": timeouts.arequeue}


@csrf_exempt  # an API for the tests' requests, which carry no CSRF token
async def call(request, name):
    """POST {"args": [...], "kwargs": {...}} to timeouts/<name>: the result, or the typed error."""
    body = json.loads(request.body)
    try:
        result = await CALLS[name](*body.get("args", ()), **body.get("kwargs", {}))
    except timeouts.TimeoutsError as exc:
        return JsonResponse({"error": type(exc).__name__, "message": str(exc)}, status=400)
    if isinstance(result, TimeoutTask):
        # The view goes on with Django's async ORM, which reads what aschedule() wrote.
        stored = await TimeoutTask.objects.aget(job_id=result.job_id)
        result = {"job_id": result.job_id, "status": stored.status, "biz_id": stored.biz_id}
    return JsonResponse({"result": result})


urlpatterns = [path("timeouts/<str:name>", call)]
