"""Extra links."""
