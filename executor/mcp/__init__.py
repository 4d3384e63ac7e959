"""toolexec and the Model Context Protocol."""

__all__: list[str] = []
