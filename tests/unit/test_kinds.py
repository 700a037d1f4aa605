"""Kinds of work (timeouts.registry): the core knows its extensions only through their kinds."""

import ast
import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import timeouts
from timeouts import registry
from timeouts.backends import queues
from timeouts.durable import calls
from timeouts.errors import InvalidBizType, UnknownBizType

PACKAGE = Path(timeouts.__file__).resolve().parent
# The extensions, each the only owner of its kind's prefix.
EXTENSIONS = {calls.PREFIX: PACKAGE / "durable", queues.PREFIX: PACKAGE / "backends"}


def publish(app, claims, producer, retry_policy, eta_headroom):
    yield from claims


@pytest.fixture
def kind():
    """A kind of the tests' own, forgotten afterwards."""
    registered = registry.register_kind(registry.Kind("test-kind:", "test kind", "the test's own",
                                                      claim_returns_attribute=True, publish=publish))
    yield registered
    registry.unregister_kind(registered)
    registry.unregister("test-kind-owner")


def test_no_prefix_of_an_extension_is_written_outside_it():
    # A prefix as code or SQL spells it: right after a quote or a backtick (prose may end a phrase in "tasks:").
    spelled = {prefix: re.compile(rf"[\"'`]{re.escape(prefix)}") for prefix in EXTENSIONS}
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        if not path.is_file() or path.suffix not in {".py", ".sql", ".html", ".txt", ".md"}:
            continue
        text = path.read_text()
        for prefix, pattern in spelled.items():
            if path.is_relative_to(EXTENSIONS[prefix]):
                continue
            found += [f"{path.relative_to(PACKAGE)}:{text.count(chr(10), 0, m.start()) + 1}: {prefix}"
                      for m in pattern.finditer(text)]
    assert found == []


# The modules that may name the extensions: those that install them (apps.py) and hand their public
# names on (celery.py: timeouts.celery.DurableTask), and the package's face.
WIRING = {PACKAGE / "apps.py", PACKAGE / "celery.py", PACKAGE / "__init__.py"}
EXTENSION_MODULES = ("timeouts.durable", "timeouts.backends")


def _names_reached(text: str, path: Path) -> set[str]:
    """The modules that `text`, the module at `path`, imports (at its top or inside a function,
    relative imports resolved) and the dotted paths it holds in strings other than docstrings (what
    import_string, a Task's Request or Celery's symbol_by_name would import)."""
    tree = ast.parse(text, str(path))
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.add(node.value.replace(":", "."))
    return found


def test_no_module_outside_the_extensions_imports_one():
    """The core (store, dispatch, worker, limiting, storage, stats, and the modules beside them)
    reaches DurableTask and the tasks backend only through their kinds (registry.Kind)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in WIRING or any(path.is_relative_to(folder) for folder in EXTENSIONS.values()):
            continue
        found += [f"{path.relative_to(PACKAGE)}: {name}" for name in sorted(_names_reached(path.read_text(), path))
                  if any(name == module or name.startswith(module + ".") for module in EXTENSION_MODULES)]
    assert found == []


def test_the_import_check_sees_every_way_of_naming_an_extension():
    module = PACKAGE / "worker" / "priority.py"  # where the relative imports below resolve from
    text = ("from timeouts.durable.starts import StartingRequest\nimport timeouts.backends.queues\n"
            "from .. import durable\nfrom ..backends import queues\n"
            "def later():\n    from timeouts.durable import calls\n"
            "REQUEST = 'timeouts.durable.starts:StartingRequest'\n")
    names = _names_reached(text, module)
    assert {"timeouts.durable.starts", "timeouts.backends.queues", "timeouts.durable", "timeouts.backends",
            "timeouts.durable.calls", "timeouts.durable.starts.StartingRequest"} <= names


def test_the_extensions_register_their_kinds_as_they_load():
    from timeouts.durable.starts import StartingRequest

    assert registry.kind_of(calls.biz_type_for("shop.tasks.charge")) is calls.KIND
    assert registry.kind_of(queues.biz_type_for("default", "emails")) is queues.KIND
    assert registry.kind_of("shop.charge") is None
    assert calls.KIND.claim_returns_attribute and calls.KIND.publish is not None
    assert not queues.KIND.claim_returns_attribute and queues.KIND.publish is None  # run as handlers' tasks
    assert registry.attribute_prefixes() == [calls.PREFIX]
    assert registry.publishing_prefixes() == (calls.PREFIX,)
    assert registry.request_classes() == (StartingRequest,)  # a worker's main process starts its calls ahead


def test_a_kind_registered_again_replaces_itself(kind):
    again = registry.register_kind(registry.Kind("test-kind:", "test kind", "the test's own"))
    assert registry.kind_of("test-kind:x") is again
    assert registry.attribute_prefixes() == [calls.PREFIX]  # derived from the kind now registered
    assert registry.publishing_prefixes() == (calls.PREFIX,)
    registry.register_kind(kind)
    assert registry.attribute_prefixes() == [calls.PREFIX, "test-kind:"]


@pytest.mark.parametrize("prefix", ["test-kind:", "test-kind:sub:", "test-"])
def test_another_kind_may_not_take_a_prefix_that_overlaps_one(kind, prefix):
    with pytest.raises(ImproperlyConfigured, match="overlaps the prefix 'test-kind:' of the kind 'test kind'"):
        registry.register_kind(registry.Kind(prefix, "another kind", "another's"))
    assert registry.kind_of("test-kind:x") is kind


def test_a_label_names_one_kind(kind):
    with pytest.raises(ImproperlyConfigured, match="already labelled 'test kind'"):
        registry.register_kind(registry.Kind("test-other:", "test kind", "another's"))


@pytest.mark.parametrize("prefix", ["", "has space", "x" * 33, None])
def test_a_bad_prefix_is_refused(prefix):
    with pytest.raises(ImproperlyConfigured, match="prefix must be 1 to 32 characters"):
        registry.register_kind(registry.Kind(prefix, "test bad", "none"))


@pytest.mark.parametrize("biz_type, says", [
    ("celery:shop.tasks.charge", "the Celery calls that timeouts.celery.DurableTask stores"),
    ("tasks:elsewhere:default", "the tasks of Django's tasks framework that timeouts.backends.TimeoutsBackend stores"),
])
def test_no_handler_may_take_a_biz_type_of_a_kind(biz_type, says):
    with pytest.raises(ImproperlyConfigured, match=re.escape(says)):
        timeouts.handler(biz_type)(lambda task: None)
    assert registry.find_handler(biz_type) is None


def test_no_handler_may_take_a_biz_type_of_a_kind_registered_later(kind):
    with pytest.raises(ImproperlyConfigured, match="starting with 'test-kind:' are the test's own"):
        timeouts.handler("test-kind:mine")(lambda task: None)


def test_a_kind_is_refused_when_a_handler_has_one_of_its_biz_types():
    timeouts.handler("test-kind-owner")(lambda task: None)
    try:
        with pytest.raises(ImproperlyConfigured, match="handlers are registered for 'test-kind-owner'"):
            registry.register_kind(registry.Kind("test-kind-", "test kind", "the test's own"))
        assert registry.kind_of("test-kind-owner") is None
    finally:
        registry.unregister("test-kind-owner")


def test_every_biz_type_of_a_kind_is_known_others_need_a_handler(kind):
    for biz_type in ("test-kind:anything", calls.biz_type_for("not.bound.here"), queues.biz_type_for("x", "y")):
        assert registry.check_known(biz_type) == biz_type
    with pytest.raises(UnknownBizType, match="no handler is registered for biz_type 'test-kind-x'"):
        registry.check_known("test-kind-x")
    with pytest.raises(InvalidBizType):
        registry.check_known("test-kind: has a space")


def test_noted_biz_types_are_listed_by_their_kind_s_label(kind):
    registry.note_of_kind("test-kind:listed")
    assert registry.noted_of_kinds()["test kind"] == {"test-kind:listed"}
    with pytest.raises(ValueError, match="of no registered kind"):
        registry.note_of_kind("test.unkinded")
    registry.unregister_kind(kind)
    assert "test kind" not in registry.noted_of_kinds()
