"""Time-travel audits of the lakehouse: history, prefix integrity, accounting, diff, restore."""
