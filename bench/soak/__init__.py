"""make soak: the pipeline at a steady feed for a while, sampled, judged for growth.

Read in this order: __main__ (the command and what it promises), settings (options and the
job environment), run (the steps of one soak), sample (what a sample reads), judge (when a
series grows), charts (the PNGs and index.html).
"""
