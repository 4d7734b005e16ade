"""Planner service: cost model, ceilings, directions and the agents that propose candidate systems.

Never imports specpilot.engine: it reaches a system only through the GPU worker interface.
"""
