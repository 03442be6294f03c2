"""Which manifests the kubernetes kind writes where, and the kustomizations tying them together: a base (namespace,
claim, scripts, workloads, Services, disruption budgets, the admin-key Secret from secret.env) and overlays adding
what needs operators: `monitoring` (prometheus-operator's PodMonitors of Triton and the OpenAI front end, and the PrometheusRule) and, with
deploy.kubernetes.autoscaling, `autoscaling` (the HorizontalPodAutoscaler and the prometheus-adapter rule)."""

from __future__ import annotations

import os
from typing import Any

from pipeline.config.spec import Spec
from pipeline.deploy.kubernetes import llmapi_forms, names, resources, workloads

Manifests = dict[str, list[dict[str, Any]]]  # path in the deployment directory -> its documents


def manifests(spec: Spec, options_text: str | None = None) -> Manifests:
    """`options_text`: the trtllm-serve form's --extra_llm_api_options YAML (deploy.kubernetes.llmapi_form trtllm-serve)."""
    base = names.BASE_DIR
    found: Manifests = {f"{base}/namespace.yaml": [resources.namespace(spec)]}
    if spec.deploy.kubernetes_settings.storage.create:
        found[f"{base}/storage.yaml"] = [resources.claim(spec)]
    found[f"{base}/scripts.yaml"] = [resources.scripts(spec)]
    if llmapi_forms.runs_trtllm_serve(spec):
        if options_text is None:
            raise ValueError("the trtllm-serve form needs its --extra_llm_api_options YAML (options_text)")
        found[workload_file(spec)] = [llmapi_forms.options_config_map(spec, options_text), llmapi_forms.trtllm_serve_deployment(spec)]
    else:
        triton = workloads.triton_workload(spec)
        found[workload_file(spec)] = [*(resources.leader_access(spec) if workloads.spans_nodes(spec) else []), triton]
    if names.OPENAI in llmapi_forms.front_components(spec):
        found[f"{base}/openai.yaml"] = [workloads.openai_deployment(spec)]
    found[f"{base}/services.yaml"] = resources.services(spec)
    found[f"{base}/disruption.yaml"] = resources.disruption_budgets(spec)
    if llmapi_forms.runs_trtllm_serve(spec):  # no Prometheus endpoint to monitor (pipeline.deploy.kubernetes.llmapi_forms)
        return found
    monitors = [resources.pod_monitor(spec)]
    if names.OPENAI in llmapi_forms.front_components(spec):
        monitors.append(resources.openai_pod_monitor(spec))
    found[f"{names.MONITORING_OVERLAY}/monitoring.yaml"] = [*monitors, resources.prometheus_rule(spec)]
    if spec.deploy.kubernetes_settings.autoscaling is not None:
        found[f"{names.AUTOSCALING_OVERLAY}/autoscaling.yaml"] = [resources.autoscaler(spec), resources.adapter_config_map(spec)]
    return found


def workload_file(spec: Spec) -> str:
    """The manifest holding the serving workload (its last document)."""
    name = llmapi_forms.TRTLLM_SERVE if llmapi_forms.runs_trtllm_serve(spec) else names.TRITON
    return f"{names.BASE_DIR}/{name}.yaml"


def kustomizations(spec: Spec, rendered: Manifests) -> dict[str, dict[str, Any]]:
    """kustomization.yaml of the base and of each overlay, listing the files beside it (and the layer below)."""

    def listed(directory: str) -> list[str]:
        return [path.rsplit("/", 1)[1] for path in rendered if path.rsplit("/", 1)[0] == directory]

    def kustomization(directory: str, below: str | None, **extra: Any) -> dict[str, Any]:
        layers = [os.path.relpath(below, directory)] if below else []
        return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **extra, "resources": [*layers, *listed(directory)]}

    namespace = spec.deploy.kubernetes_settings.namespace
    secret = {"name": names.object_name(spec, "secrets"), "envs": [names.SECRET_ENV]}
    found = {
        # No name suffix: kustomize would not rewrite the reference inside a LeaderWorkerSet (a CRD it does not know).
        names.BASE_DIR: kustomization(names.BASE_DIR, None, namespace=namespace, secretGenerator=[secret], generatorOptions={"disableNameSuffixHash": True}),
    }
    if llmapi_forms.runs_trtllm_serve(spec):
        return found
    found[names.MONITORING_OVERLAY] = kustomization(names.MONITORING_OVERLAY, names.BASE_DIR, namespace=namespace)
    if spec.deploy.kubernetes_settings.autoscaling is not None:
        found[names.AUTOSCALING_OVERLAY] = kustomization(names.AUTOSCALING_OVERLAY, names.MONITORING_OVERLAY, namespace=namespace)
    return found


def default_overlay(spec: Spec) -> str:
    """The overlay `kubectl apply -k` is pointed at: everything the spec asks for."""
    if llmapi_forms.runs_trtllm_serve(spec):
        return names.BASE_DIR
    return names.AUTOSCALING_OVERLAY if spec.deploy.kubernetes_settings.autoscaling is not None else names.MONITORING_OVERLAY
