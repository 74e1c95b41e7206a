"""dflash_edge.devices — see DESIGN.md §2."""
