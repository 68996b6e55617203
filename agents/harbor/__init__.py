"""Harbor (PyPI `harbor`): its tasks read as Interceptor's own (`tasks.py`), or its runner driving the rollouts
(`driver.py`): Harbor's environment and installed agent, the model endpoint an Interceptor rollout."""

from agents.harbor.tasks import build_image, is_harbor_dataset, load_harbor_tasks

__all__ = ["build_image", "is_harbor_dataset", "load_harbor_tasks"]
