"""The server's defaults (importable without FastAPI or uvicorn, e.g. by a command line's parser)."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9000
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: larger request bodies get 413
DEFAULT_MAX_JSON_DEPTH = 64  # arrays/objects nested deeper in a body get 400 (json_too_deep); chat with content parts is 5
DEFAULT_MAX_N = 8  # most choices (n x prompts) one request may ask for
DEFAULT_REQUEST_TIMEOUT_S = 600.0  # deadline of each Triton request
MAX_COMPLETION_LOGPROBS = 5  # completions' `logprobs`: most likely alternatives per token (OpenAI's limit)
MAX_TOP_LOGPROBS = 20  # chat completions' `top_logprobs` (OpenAI's limit)
