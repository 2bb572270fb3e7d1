"""``python -m ckptstore ...``: the ``ckptstore`` command, where the console script is not on the
``PATH`` (a ``pip install --user`` on a training node, a venv not activated)."""
from ckptstore.cli import main

main(prog_name="ckptstore")
