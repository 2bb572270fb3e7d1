"""ckptstore benchmarks: every contender runs in its own fresh process, measured from /proc.

``harness`` runs contenders and records results, ``worker`` is the measuring subprocess,
``procfs`` reads /proc, ``report`` writes Markdown tables, ``data`` makes seeded synthetic
checkpoints, and each ``bench_*`` module is one benchmark with a command-line interface.
"""
