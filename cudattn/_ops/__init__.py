"""Public operations: each entry states its signature and what is particular to it, and runs as one call."""
