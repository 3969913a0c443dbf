"""The error a user can act on, shared by every layer: a stage, a trainer or a data check raises it
with a message that names the file, the row and the field, and the stage prints it in one line
without a traceback (utils/core/stages.py `run_main`)."""


class StageError(RuntimeError):
    """A failure the user can act on; printed without a traceback."""
