"""Engine server: the engine behind the SGLang-native `/generate` and the OpenAI-compatible
`/v1/completions` HTTP APIs (`specpilot serve engine`).

`protocol.py` parses request bodies and builds answers (pure functions), `batcher.py` is the
one thread that owns the engine and batches waiting requests, `app.py` wires both to FastAPI.
"""
