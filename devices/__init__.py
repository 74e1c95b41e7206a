"""dflash_edge.devices (floor 1, pure Python; imports nothing of ours): device profiles as sourced
data, detection, the memory / speed planner and energy meters. See docs/design.md §2 and
`dflash-edge devices --help`.

>>> from dflash_edge.devices.profiles import get_profile       # doctest: +SKIP
>>> get_profile("jetson-orin-nx-16gb").usable_memory_gb          # doctest: +SKIP
14.5
"""
