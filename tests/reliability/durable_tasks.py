"""The oracle's DurableTask, `oracle.durable`, for the worker processes (settings_calls.py imports it)."""

from .durable_calls import define_task

durable = define_task()
