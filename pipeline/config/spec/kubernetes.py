"""The spec's deploy.kubernetes and deploy.alerts sections, and where a deployment's ranks can be placed.

deploy.alerts: the bounds of the Prometheus alerts every deploy kind renders (pipeline.deploy.rules).
deploy.kubernetes: replicas (fixed, or a HorizontalPodAutoscaler's min/max and target), the namespace,
and the PersistentVolumeClaim the model repository, engine and tokenizer are read from.

Placement (`check_placement`, a cross-section rule): a model whose ranks (build.tp_size × build.pp_size)
fit deploy.gpus_per_node runs in one pod (compose: one host); more ranks span whole nodes, which only
the kubernetes kind renders (a LeaderWorkerSet), and only when they divide into nodes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.spec.choices import DeployKind
from pipeline.config.spec.strict import StrictModel
from pipeline.config.targets import traits_of

if TYPE_CHECKING:
    from pipeline.config.spec import Spec

# RFC 1123: a label (namespaces) and a subdomain (claim and storage-class names), as Kubernetes checks them.
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_DURATION = re.compile(r"^[0-9]+[smh]$")


def _dns_subdomain(value: str | None, what: str) -> str | None:
    if value is not None and not DNS1123_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a DNS-1123 subdomain ({what}): lowercase letters, digits, '-' and '.', starting and ending alphanumeric")
    return value


class AlertBounds(StrictModel):
    queue_time_ms: float = Field(default=500.0, gt=0, description="Alert when the mean queue time of a model's requests exceeds this (ms).")
    kv_cache_utilization: float = Field(default=0.9, gt=0, le=1, description="Alert when the LLM's used KV-cache blocks exceed this fraction of its blocks.")
    failure_ratio: float = Field(default=0.05, gt=0, le=1, description="Alert when this fraction of a model's requests fail.")
    pending_for: str = Field(default="5m", pattern=_DURATION.pattern, description="How long a bound must be exceeded before its alert fires (e.g. 5m).")


class AutoscalingSpec(StrictModel):
    min_replicas: int = Field(default=1, ge=1, description="Fewest Triton replicas the HorizontalPodAutoscaler keeps.")
    max_replicas: int = Field(default=4, ge=1, description="Most Triton replicas the HorizontalPodAutoscaler starts.")
    queue_to_compute_target: float = Field(
        default=1.0,
        gt=0,
        description="Per-replica target of rate(queue time) / rate(compute time) of the LLM model; above it the autoscaler adds replicas.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"deploy.kubernetes.autoscaling.min_replicas ({self.min_replicas}) exceeds deploy.kubernetes.autoscaling.max_replicas ({self.max_replicas})"
            )
        return self


class ModelStorageSpec(StrictModel):
    claim_name: str = Field(default="trtllm-models", description="PersistentVolumeClaim holding the model repository, engine and tokenizer.")
    create: bool = Field(default=True, description="Render the PersistentVolumeClaim (false: it exists already).")
    storage_class: str | None = Field(default=None, description="StorageClass of the rendered claim (default: the cluster's default).")
    size: str = Field(default="200Gi", pattern=_QUANTITY.pattern, description="Requested size of the rendered claim (a Kubernetes quantity).")
    verify: bool = Field(default=True, description="An init container checks the engine and tokenizer on the claim against their artifact manifests first.")

    @field_validator("claim_name")
    @classmethod
    def _claim(cls, value: str) -> str:
        return _dns_subdomain(value, "a PersistentVolumeClaim name") or value

    @field_validator("storage_class")
    @classmethod
    def _storage_class(cls, value: str | None) -> str | None:
        return _dns_subdomain(value, "a StorageClass name")


class KubernetesSpec(StrictModel):
    namespace: str = Field(default="trtllm", description="Namespace the overlays put every resource in.")
    replicas: int = Field(default=1, ge=1, description="Triton replicas when autoscaling is not set.")
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="A HorizontalPodAutoscaler on the queue-to-compute ratio (needs prometheus-adapter); replaces replicas."
    )
    openai_replicas: int = Field(default=1, ge=1, description="Replicas of the OpenAI-compatible front end.")
    storage: ModelStorageSpec = Field(default_factory=ModelStorageSpec, description="Where the pods read the model from.")
    llmapi_form: Literal["triton", "trtllm-serve"] = Field(
        default="triton",
        description="build.target llmapi only: the form the manifests run: Triton with NVIDIA's llmapi model, or trtllm-serve (its OpenAI endpoint).",
    )

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not DNS1123_LABEL.match(value):
            raise ValueError(f"{value!r} is not a DNS-1123 label (a namespace): at most 63 lowercase letters, digits and '-'")
        return value


def check_placement(spec: Spec) -> None:
    """Refuse ranks no node shape can hold, or that do not divide into whole nodes."""
    deploy, build = spec.deploy, spec.build
    kubernetes = deploy.kind is DeployKind.kubernetes
    if kubernetes and deploy.gpus:
        raise ValueError("deploy.gpus lists host GPU ids, but deploy.kind is kubernetes: the scheduler assigns GPUs; remove deploy.gpus")
    refusal = traits_of(build.target).no_kubernetes_because
    if kubernetes and refusal is not None:
        raise ValueError(f"deploy.kind kubernetes is refused for build.target {build.target.value}: {refusal}")
    if kubernetes:
        _check_llmapi_form(spec)
    if not traits_of(build.target).places_ranks_on_deploy_gpus:
        return
    ranks = build.tp_size * build.pp_size
    per_node = deploy.gpus_per_node
    instances = spec.serve.instances.tensorrt_llm
    if ranks <= per_node:
        if ranks * instances > per_node:
            raise ValueError(
                f"deploy.gpus_per_node ({per_node}) cannot hold build.tp_size × build.pp_size × serve.instances.tensorrt_llm "
                f"({ranks} × {instances} = {ranks * instances}) GPUs in one server; no node shape has that many"
            )
        return
    multinode_refusal = traits_of(build.target).no_multinode_because
    if kubernetes and multinode_refusal is not None:
        raise ValueError(
            f"build.tp_size × build.pp_size ({ranks}) > deploy.gpus_per_node ({per_node}) is refused for build.target "
            f"{build.target.value} on deploy.kind kubernetes: {multinode_refusal}"
        )
    if not kubernetes:
        raise ValueError(
            f"deploy.gpus_per_node ({per_node}) cannot hold build.tp_size × build.pp_size ({ranks}) GPUs, and deploy.kind "
            f"{deploy.kind.value} runs on one host; use deploy.kind: kubernetes (a LeaderWorkerSet across nodes)"
        )
    if ranks % per_node:
        raise ValueError(
            f"build.tp_size × build.pp_size ({ranks}) does not divide into nodes of deploy.gpus_per_node ({per_node}) GPUs: a multi-node group fills every node"
        )
    if instances > 1:
        raise ValueError(f"serve.instances.tensorrt_llm ({instances}) > 1 with a model spanning {ranks // per_node} nodes: one instance per group")


def _check_llmapi_form(spec: Spec) -> None:
    settings, target = spec.deploy.kubernetes_settings, spec.build.target.value
    form = settings.llmapi_form
    if form != "triton" and not traits_of(spec.build.target).has_llmapi_forms:
        raise ValueError(f"deploy.kubernetes.llmapi_form {form} is for build.target llmapi; build.target {target} has one form (Triton)")
    if form == "trtllm-serve" and settings.autoscaling is not None:
        raise ValueError(
            "deploy.kubernetes.autoscaling is refused with deploy.kubernetes.llmapi_form trtllm-serve (build.target llmapi): the "
            "autoscaler's metric is Triton's queue-to-compute ratio (nv_inference_queue_duration_us), which trtllm-serve does "
            "not expose; use deploy.kubernetes.replicas, or llmapi_form triton"
        )
