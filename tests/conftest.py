"""Shared test configuration."""

pytest_plugins = ["pytester"]
