"""One error family, so the CLI can turn any expected failure into one clear sentence."""


class ArithmechError(Exception):
    """An expected failure caused by input or environment.

    Its message says what is wrong and how to fix it.
    """


class ConfigError(ArithmechError):
    """A configuration value or option is invalid."""


class SpecError(ArithmechError):
    """A model's architecture is not supported, or does not match its spec."""


class DataError(ArithmechError):
    """A prompt file, template or data set is malformed or empty."""
