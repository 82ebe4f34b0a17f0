"""``python -m ror_annotate.cli``: the ``ror`` command."""

from . import app

app(prog_name="ror")
