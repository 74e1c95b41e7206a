"""dflash_edge.quantize — see DESIGN.md §2."""
