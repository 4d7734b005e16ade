"""SpecPilot: measure, improve and prove speculative decoding for one deployment."""
