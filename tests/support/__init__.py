"""Test infrastructure: what tests start around the pipeline (a standalone Spark cluster)."""
