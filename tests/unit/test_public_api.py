"""The shape of the public API, read without a database: what each public module exports, that
every public function and class is annotated, keyword-only options with one default each, async
twins with their sync function's signature, and a TypeError that names the function."""

import importlib
import inspect

import pytest

import timeouts

PUBLIC_MODULES = ("timeouts", "timeouts.celery", "timeouts.backends", "timeouts.models", "timeouts.errors",
                  "timeouts.events", "timeouts.metrics", "timeouts.testing")
ASYNC_TWINS = {"aschedule": "schedule", "abulk_schedule": "bulk_schedule", "acancel": "cancel",
               "areschedule": "reschedule", "arequeue": "requeue"}


def public(module_name):
    module = importlib.import_module(module_name)
    return [(name, getattr(module, name)) for name in module.__all__]


def functions_of(obj):
    """`obj` itself if it is a function; if it is a class of timeouts', the functions it defines
    itself that callers use: its public methods, properties and __init__."""
    if inspect.isfunction(obj):
        return [obj]
    if not inspect.isclass(obj) or not obj.__module__.startswith("timeouts"):
        return []
    found = []
    for name, member in vars(obj).items():
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        member = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(member):
            found.append(member)
    return found


def test_dir_lists_the_public_names_only():
    assert set(dir(timeouts)) == {*timeouts.__all__, "__version__"}
    for internal in ("errors", "registry", "limiting", "validation", "store", "storage"):
        assert internal not in dir(timeouts)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_module_says_what_it_exports_and_has_it(module_name):
    names = importlib.import_module(module_name).__all__
    assert len(names) == len(set(names)) and all(value is not None for _, value in public(module_name))


def test_timeouts_celery_exports_no_name_of_another_package():
    import timeouts.celery

    for name in ("Exchange", "Queue", "WeakKeyDictionary", "Celery"):
        assert not hasattr(timeouts.celery, name), name
    assert set(timeouts.celery.__all__) == {"DurableTask", "beat_schedule", "cancel", "setup"}


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_function_is_annotated(module_name):
    unannotated = []
    for _name, obj in public(module_name):
        for function in functions_of(obj):
            signature = inspect.signature(function)
            missing = [parameter.name for parameter in signature.parameters.values()
                       if parameter.annotation is inspect.Parameter.empty and parameter.name not in ("self", "cls")]
            if missing or signature.return_annotation is inspect.Signature.empty:
                unannotated.append(f"{function.__qualname__}: {missing or 'its result'}")
    assert not unannotated


def test_options_are_keyword_only_with_one_default_each():
    from timeouts.models import TimeoutTask

    for function in (timeouts.schedule, timeouts.aschedule, TimeoutTask.objects.schedule):
        parameters = inspect.signature(function).parameters
        assert [name for name, p in parameters.items() if p.kind is not p.KEYWORD_ONLY] == ["biz_type", "biz_id"]
        assert parameters["on_conflict"].default == "error"
    for name in ("schedule", "bulk_schedule", "cancel", "reschedule", "requeue", *ASYNC_TWINS, "limits",
                 "set_limits", "reset_limits", "pause", "resume"):
        using = inspect.signature(getattr(timeouts, name)).parameters["using"]
        assert (using.kind, using.default) == (using.KEYWORD_ONLY, None), name


@pytest.mark.parametrize("name, sync_name", sorted(ASYNC_TWINS.items()))
def test_each_async_function_takes_what_its_sync_twin_takes(name, sync_name):
    function, twin = getattr(timeouts, name), getattr(timeouts, sync_name)
    assert inspect.iscoroutinefunction(function) and name in timeouts.__all__
    twin_signature = inspect.signature(twin)
    assert inspect.signature(function) == twin_signature


@pytest.mark.parametrize("call, qualified", [
    (lambda: timeouts.schedule("test.record", 1, when=5), "schedule"),
    (lambda: timeouts.bulk_schedule([], when=5), "bulk_schedule"),
    (lambda: timeouts.cancel("test.record", 1, when=5), "cancel"),
    (lambda: timeouts.reschedule("test.record", 1, when=5), "reschedule"),
    (lambda: timeouts.requeue("test.record", 1, when=5), "requeue"),
    (lambda: timeouts.acancel("test.record", 1, when=5), "acancel"),
    (lambda: timeouts.limits("test.record", when=5), "limits"),
    (lambda: timeouts.handler("test.record", when=5), "handler"),
])
def test_an_unknown_keyword_raises_a_type_error_naming_the_function(call, qualified):
    with pytest.raises(TypeError, match=rf"^{qualified}\(\) got an unexpected keyword argument 'when'$"):
        call()


def test_an_unknown_keyword_of_the_manager_names_its_method():
    from timeouts.models import TimeoutTask

    with pytest.raises(TypeError, match=r"^TimeoutTaskManager\.schedule\(\) got an unexpected keyword argument"):
        TimeoutTask.objects.schedule("test.record", 1, when=5)
    with pytest.raises(TypeError, match=r"^schedule\(\) takes 2 positional arguments but 3 were given$"):
        timeouts.schedule("test.record", 1, 5)
