"""deploy.kubernetes, deploy.alerts, deploy.gpus_per_node and deploy.image at `validate`: each bad input of #17 refused
with a SpecError naming the field (through load_config, as `trtllm-pipeline validate` reads a file)."""

from __future__ import annotations

import pytest

from pipeline.config.loader import load_config
from pipeline.errors import SpecError
from tests.conftest import BUILD_CONFIGS

K8S_8B = BUILD_CONFIGS / "llama-3.1-8b-fp8-k8s.yaml"
COMPOSE_8B = BUILD_CONFIGS / "llama-3.1-8b-fp8.yaml"
TWO_NODES = BUILD_CONFIGS / "llama-3.3-70b-fp8-2node.yaml"


def refused(path, *overrides: str) -> str:
    with pytest.raises(SpecError) as info:
        load_config(path, overrides)
    return info.value.message


@pytest.mark.parametrize(
    "path, overrides, expected",
    [
        (K8S_8B, ("deploy.kubernetes.replicas=0",), "deploy.kubernetes.replicas"),
        (K8S_8B, ("deploy.kubernetes.autoscaling.min_replicas=0",), "deploy.kubernetes.autoscaling.min_replicas"),
        (K8S_8B, ("deploy.kubernetes.autoscaling.min_replicas=5",), "min_replicas (5) exceeds deploy.kubernetes.autoscaling.max_replicas (4)"),
        (K8S_8B, ("build.tp_size=4", "serve.instances.tensorrt_llm=3"), "deploy.gpus_per_node (8) cannot hold"),
        (K8S_8B, ("deploy.gpus_per_node=32",), "deploy.gpus_per_node"),
        (K8S_8B, ("build.tp_size=12",), "build.tp_size × build.pp_size (12) does not divide into nodes of deploy.gpus_per_node (8)"),
        (TWO_NODES, ("serve.instances.tensorrt_llm=2",), "serve.instances.tensorrt_llm (2) > 1 with a model spanning 2 nodes"),
        (COMPOSE_8B, ("build.tp_size=16", "deploy.gpus=[]"), "deploy.kind compose runs on one host"),
        (K8S_8B, ("deploy.openai_port=8001",), "deploy.openai_port (8001) is the same as deploy.grpc_port"),
        (K8S_8B, ("deploy.metrics_port=8000",), "deploy.metrics_port (8000) is the same as deploy.http_port"),
        (K8S_8B, ("deploy.kubernetes.storage.storage_class=Fast_SSD",), "deploy.kubernetes.storage.storage_class"),
        (K8S_8B, ("deploy.kubernetes.storage.claim_name=models-",), "deploy.kubernetes.storage.claim_name"),
        (K8S_8B, ("deploy.kubernetes.namespace=llm.prod",), "deploy.kubernetes.namespace"),
        (K8S_8B, ("deploy.image=nvcr.io/nvidia/tritonserver",), "deploy.image"),
        (K8S_8B, ("deploy.image=tritonserver@sha256:abc",), "deploy.image"),
        (K8S_8B, ("deploy.gpus=[0]",), "deploy.gpus lists host GPU ids, but deploy.kind is kubernetes"),
        (K8S_8B, ("deploy.alerts.kv_cache_utilization=1.5",), "deploy.alerts.kv_cache_utilization"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_input_is_refused_naming_the_field(path, overrides, expected):
    assert expected in refused(path, *overrides)


def test_dns_messages_say_what_a_name_may_hold():
    message = refused(K8S_8B, "deploy.kubernetes.storage.storage_class=Fast_SSD")
    assert "'Fast_SSD' is not a DNS-1123 subdomain (a StorageClass name)" in message


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3",
        "registry.local:5000/team/triton:1",
        "triton@sha256:" + "a" * 64,
        "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3@sha256:" + "0" * 64,
    ],
)
def test_image_references_with_a_tag_or_digest_are_accepted(image):
    assert load_config(K8S_8B, (f"deploy.image={image}",)).spec.deploy.image == image


def test_a_model_filling_whole_nodes_is_placed_on_kubernetes_only():
    spec = load_config(TWO_NODES).spec
    assert spec.build.tp_size * spec.build.pp_size == 2 * spec.deploy.gpus_per_node
    assert "deploy.kind compose runs on one host" in refused(TWO_NODES, "deploy.kind=compose")
