"""dflash_edge.train — see docs/design.md §2."""
