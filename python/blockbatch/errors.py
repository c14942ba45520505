"""Exceptions raised by blockbatch's Python layer."""


class CheckpointError(ValueError):
    """A checkpoint folder or file is missing, malformed or inconsistent.

    The message always names the file and, where it applies, the tensor or config key.
    """
