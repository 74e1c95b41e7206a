"""dflash_edge.runtime — see DESIGN.md §2."""
