"""siglo's built-in backend plugins, each registered through the ``siglo`` entry point."""
