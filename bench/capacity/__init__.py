"""The capacity benchmark (`bench capacity`): the streamed tokens/s the Python models around `tensorrt_llm`
sustain, measured against a GPU-pace stand-in for it (standin/), with their CPU per token, beside NVIDIA's own
models. Nothing is imported here."""
