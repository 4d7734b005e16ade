"""specpilot.services: the deployable services (gpu_worker, controller, planner, memory_api,
engine_server).

Each service is a room of its own: they reach each other only through the proto contracts,
REST and the queue, never by importing each other's modules.
"""
