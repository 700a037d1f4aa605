"""Limits, pauses and lateness policies per biz_type, and each shard's part of the limits."""
