"""User-facing errors: one clear line saying what was wrong and where."""


class RankgenError(Exception):
    """A problem with the user's input (paths, configs, checkpoints).

    The CLI prints these as a single `error: ...` line and exits non-zero;
    anything else is a bug and keeps its traceback.
    """
