"""Building engines: the incremental stage runner, atomic outputs, content hashing and the runtimes."""
