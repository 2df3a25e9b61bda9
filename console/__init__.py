"""The `lakehouse` console command (console.commands), one entry point for every tool."""
