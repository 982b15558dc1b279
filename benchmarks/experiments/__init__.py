"""Experiments behind figures the docs quote, kept runnable; not part of the harness.

Each module measured one thing once, mostly as an A/B of two ways in one process, and
is run as ``python -m benchmarks.experiments.NAME``; its docstring's first line says what
it measured, the rest how to run it. ``python -m benchmarks`` never imports them.
"""
