"""Memory API service: memory entries, versions, the requirement graph and the reproduce check.
"""
