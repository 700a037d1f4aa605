"""Limits and pauses per biz_type, and each shard's part of them."""
