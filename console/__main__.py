"""`python -m console ...` is `lakehouse ...` without the installed script."""
from console.commands import lakehouse

lakehouse(prog_name="lakehouse")
