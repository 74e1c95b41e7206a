"""Moved to `dflash_edge.runtime.publish` (quantize/ publishes bundles too); kept so imports keep working."""
from dflash_edge.runtime.publish import publish_dir  # noqa: F401
