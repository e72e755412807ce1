"""The format's one error: what a reader raises for a manifest or part it cannot trust."""


class ManifestError(ValueError):
    """The manifest is missing, unreadable, or fails its own checksum."""
