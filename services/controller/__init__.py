"""Controller service: paired swapped runs, statistics, token forcing and the verdict; the REST
dashboard and round state.

Never imports specpilot.engine: it reaches a system only through the GPU worker interface.
"""
