"""``python -m ror_annotate``: the ``ror`` command."""

from .cli import app

app(prog_name="ror")
