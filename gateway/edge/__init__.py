"""The connection before the app sees a request: the guarded uvicorn protocol, client slots, turns, the
penalty box, one-write answers and the process supervisor. The only home of private uvicorn code."""
