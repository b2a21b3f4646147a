"""The error of a sweep definition that cannot run."""


class DefinitionError(ValueError):
    """A sweep definition that cannot run, with what is wrong in it."""
