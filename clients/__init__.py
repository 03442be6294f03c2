"""Clients of a served trtllm-pipeline deployment (HTTP, gRPC, streaming); they depend only on the served contract."""
