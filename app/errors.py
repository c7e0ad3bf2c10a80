"""The one error a user of the CLI sees: a clear reason, exit code 2."""


class UserError(Exception):
    """Bad input or configuration from the user; printed as one line, exit code 2.

    Library layers raise their own precise errors (``rankwatch.schemas.InvalidMessage``,
    ``rankwatch.sim.ModelError``...); commands translate them into this.
    """
