"""The clients' defaults (importable without tritonclient, e.g. by a command line's parser)."""

DEFAULT_URLS: dict[str, str] = {"grpc": "localhost:8001", "http": "localhost:8000"}
DEFAULT_OPENAI_URL = "http://localhost:9000/v1"  # the OpenAI front end (`trtllm-pipeline openai`, the compose service)
DEFAULT_TIMEOUT_S = 60.0
