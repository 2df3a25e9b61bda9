"""Crash-and-restart proof: kill -9 the three jobs at random points while data arrives, then audit."""
