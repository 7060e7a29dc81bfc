"""The root of tandem's exception tree.

Every error a user can cause (a missing model, a bad flag value, a corrupt index) is a
`TandemError` whose message is one line naming the problem; the CLI prints it without a
traceback and exits with status 2.
"""


class TandemError(Exception):
    """A user-facing error with a one-line message."""


class ModeNotServed(TandemError):
    """The cloud refused a session because it does not serve that mode (its Error code "mode")."""
