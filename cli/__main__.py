"""`python -m leveret.cli` runs the `leveret` command."""

from leveret.cli.app import main

main()
