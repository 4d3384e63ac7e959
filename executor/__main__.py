"""``python -m executor`` is the ``toolexec`` command."""

from executor.cli import main

main()
