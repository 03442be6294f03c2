"""Triton Python-backend code of the capacity bench (`model.py`: the GPU-pace stand-in for `tensorrt_llm`,
`gpu_pace.py`: its pure part, `floor.py`: a postprocessing that does nothing). The bench copies these files into
its own repository; nothing imports them here, and the package stage never renders them."""
