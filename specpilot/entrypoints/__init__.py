"""The entrypoints: the command line, the demo, the self-test, the container health check, the stub
generator and the composition root (`bootstrap`) that wires adapters into the ports. Nothing below
the entrypoints imports them; they import everything."""
