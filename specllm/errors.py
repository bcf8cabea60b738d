"""The one exception type the CLI turns into a single clear line and a non-zero exit code."""


class SpecllmError(Exception):
    """A problem the user can fix: bad input, a missing file, an incompatible model pair."""
