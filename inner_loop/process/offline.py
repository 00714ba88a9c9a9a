"""A member process that reads the hub and datasets caches only (``go_offline``). Why here: the flags are read by
huggingface_hub and datasets when they are imported, so a process whose modules are imported already (a member
forked from inner_loop/process/fork_server.py, a job process) must set them in those modules too; the fork server
and the member's staging both turn a process offline this one way."""
from __future__ import annotations

import os
import sys
from typing import Mapping

#: the environment of a process that reads the local caches only
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def asks_offline(env: Mapping[str, str]) -> bool:
    """``env`` is an offline process's (every OFFLINE_ENV variable set as go_offline sets it)."""
    return all(env.get(key) == value for key, value in OFFLINE_ENV.items())


def go_offline() -> None:
    """Make this process (and its children) read the hub and datasets caches only: the environment, and the
    modules that read it at import when they are imported already."""
    os.environ.update(OFFLINE_ENV)
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True
        datasets_config.HF_DATASETS_OFFLINE = True
