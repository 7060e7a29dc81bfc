"""The device's OpenAI-compatible HTTP API (`tandem device serve`).

An app talks to the device as to any local LLM server (`/v1/completions`,
`/v1/chat/completions`, streaming as server-sent events); behind the API the device runs one
generation at a time in its configured mode, collaborating with a cloud.

    backends.py   the Backend protocol (one generation in one mode) + local, spec, fake
    retrieval.py  the dragon and rapid backends (they build their own prompts)
    text.py       token stream -> text: stop strings, held-back prefixes, finish reasons
    engine.py     runs jobs one at a time in a worker thread; metrics; request log lines
    schemas.py    request bodies (validated) and OpenAI-shaped responses and errors
    app.py        the FastAPI app: routes, SSE, error handlers
    server.py     settings -> model + backend + app; uvicorn (foreground or a test thread)
"""
