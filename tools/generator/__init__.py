"""Test feeds: realistic Nest camera JSON with known defects (duplicates, late, malformed, unknown
devices), written to the landing folder or a Kafka topic. `python -m tools.generator --help`."""
