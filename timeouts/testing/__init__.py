"""Helpers for testing code that uses timeouts."""
