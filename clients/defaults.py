"""The clients' defaults (importable without tritonclient, e.g. by a command line's parser)."""

DEFAULT_URLS: dict[str, str] = {"grpc": "localhost:8001", "http": "localhost:8000"}
DEFAULT_TIMEOUT_S = 60.0
