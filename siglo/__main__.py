"""``python -m siglo`` runs the command line."""

from siglo.cli import main

main()
