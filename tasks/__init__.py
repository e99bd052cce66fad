"""seqio tasks of this repository: importing the package registers them (see rankgen_tasks.py)."""

from tasks import rankgen_tasks  # noqa: F401
