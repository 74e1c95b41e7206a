"""dflash_edge.serve — an OpenAI-compatible local HTTP server over the runtime.

Floor 5, beside train/. Needs the `serve` extra (Starlette + uvicorn), imported only here: the
runtime-only install never needs it.

    dflash-edge serve bundle/ --port 8000        # then any OpenAI client:
                                                 # base_url="http://127.0.0.1:8000/v1"
"""
