"""`lakehouse report`: tools.report with the flows' graph (pipeline.graph) as its first picture;
the report sits on a floor below the pipeline's declarations, so the console joins them."""
from __future__ import annotations


def main(argv=None, prog: str = "lakehouse report") -> int:
    from pipeline.graph import picture
    from tools.report import main as report

    return report(argv, prog=prog, pictures=[picture])
