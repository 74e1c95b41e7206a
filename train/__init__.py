"""dflash_edge.train — see DESIGN.md §2."""
