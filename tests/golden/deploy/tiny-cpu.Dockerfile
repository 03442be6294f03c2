# Rendered by trtllm-pipeline (deploy stage) for build tiny-cpu: the cpu target's Triton server.
# The project (src/, copied by the deploy stage) is installed with the tritonserver bundled in
# nvidia-pytriton; the reference engine runs inside Triton's Python backend. Torch is the CPU build.
# Base image: Python base of the cpu image
FROM python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv \
 && pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY src/ /opt/trtllm-pipeline/
RUN pip install --constraint /opt/trtllm-pipeline/constraints.txt /opt/trtllm-pipeline \
 && python -m pipeline.deploy.image_setup --backend-directory /opt/triton-backends --link /opt/tritonserver \
 && groupadd --gid 1000 triton-server \
 && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin triton-server

USER 1000:1000
WORKDIR /tmp
EXPOSE 8000 8001 8002
