"""Host code that misuses the public API: the type check must report each line marked `# error:`
with that text, so that a check passing host_module.py is known to look (tests/typing/test_mypy.py)."""

import timeouts
from timeouts.models import TimeoutTask


def misuse(task: TimeoutTask) -> None:
    timeouts.schedule("order.close", 1, when=5)  # error: Unexpected keyword argument "when"
    timeouts.schedule("order.close", 1, 5)  # error: Too many positional arguments
    timeouts.schedule("order.close", 1.5, delay=5)  # error: Argument 2 to "schedule" has incompatible type "float"
    timeouts.schedule("order.close", 1, delay=5, max_wait=300)  # error: Argument "max_wait" to "schedule"
    text: str = timeouts.cancel("order.close", 1)  # error: Incompatible types in assignment
    count: str = TimeoutTask.objects.cancel("order.close", 1)  # error: Incompatible types in assignment
    moved: str = task.reschedule(delay=5)  # error: Incompatible types in assignment
    timeouts.aschedule("order.close", 1, delay=5)  # error: "Coroutine[Any, Any, TimeoutTask]" must be used
    print(text, count, moved)
