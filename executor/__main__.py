"""``python -m toolexec`` is the ``toolexec`` command."""

from toolexec.cli import main

main()
