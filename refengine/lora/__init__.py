"""Multi-LoRA serving: NVIDIA's LoRA inputs of a request (request.py `LoraRequest`: lora_task_id, lora_weights,
lora_config), the adapter cache with TensorRT-LLM's semantics (cache.py), and the grouped per-adapter updates of a batch
(batch.py). TensorRT-LLM's module ids and their place in a refengine layer: modules.py. This package's own imports stay
torch-free (settings and module ids are read by the engine config); the torch modules are imported by name."""
