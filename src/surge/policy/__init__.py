"""Pure decisions: no asyncio, sockets, clocks, global random or logging.

Every function here takes its inputs (including `now` and an `rng`) and returns a
decision; the async shells in router/, controller/ and the simulator carry them out.
"""
