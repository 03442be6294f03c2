"""Rendering at the edge: the Triton model repository for an engine directory and a serve spec."""

from pipeline.backends.engine_facts import EngineFacts, engine_facts, read_engine_config
from pipeline.render.consistency import check_consistency
from pipeline.render.repository import ConfigPaths, render_model_repository
from pipeline.render.repository_request import RepositoryRequest

__all__ = [
    "ConfigPaths",
    "EngineFacts",
    "RepositoryRequest",
    "check_consistency",
    "engine_facts",
    "read_engine_config",
    "render_model_repository",
]
