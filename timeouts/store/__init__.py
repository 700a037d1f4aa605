"""Everything that writes timeouts' tables: each change of a task's state is a named function over a named query."""
