"""Observability tests: OpenTelemetry spans and metrics, and the ``siglo ui`` dashboard."""
