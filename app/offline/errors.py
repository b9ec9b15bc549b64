class OfflineError(Exception):
    """Ends the run with a message and exit code 1."""
