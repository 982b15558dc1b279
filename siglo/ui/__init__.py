"""``siglo ui``: a local, server-rendered dashboard of what a store holds (``siglo[ui]``).

:mod:`siglo.ui.data` reads (runs, one run, what needs attention) and
:mod:`siglo.ui.actions` writes (cancel, deliver an event, delete) through a backend that
:func:`siglo.connect` opened with the one configuration, so the dashboard stores and shows
what every other path does: the settings' pipeline, redaction included.
:mod:`siglo.ui.server` is the Starlette application (Jinja2 templates, no JavaScript
build step) that ``siglo ui`` serves with uvicorn. docs/observability.md shows it.
"""
