"""Where tasks live: time partitions, shards, moving slots between shards."""
