"""Helpers the tests share: processes, brokers, factories, shards, message builders."""
