"""Two real GRPOTrainer steps on CPU through trainer.rl.environment: the embedded default calls `bash("answer N")`, the
call runs in a sandbox, the host grader's reward trains the policy, and no sandbox is left behind."""

from __future__ import annotations

import json
import os

from agents.sandbox.base import LocalSandbox, LocalSandboxConfig
from agents.sandbox.namespace import NamespaceSandbox, namespaces_unavailable
from agents.tasks import load_tasks
from tests.trainer.test_environment import _live_processes_mentioning
from trainer.rl.environment import environment_factory_for, grader_reward, task_dataset
from trainer.rl.environment_host import SandboxHost


def test_two_grpo_steps_call_tools_in_sandboxes_and_train_on_grader_rewards(tool_model_dir, tmp_path):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "add-2-3", "instruction": "What is 2 + 3? Submit the answer 5 by running the "
                                "shell command: answer 5", "grader": {"kind": "answer", "expected": "5"}}) + "\n")
    tasks = load_tasks(path)
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    config = LocalSandboxConfig(parent_dir=boxes)
    host = SandboxHost(sandbox=(lambda: NamespaceSandbox(config)) if namespaces_unavailable() is None
                       else (lambda: LocalSandbox(config)))
    seen = []

    def reward(environments, **kwargs):
        rewards = grader_reward(environments, **kwargs)
        seen.extend((env.state, value) for env, value in zip(environments, rewards, strict=True))
        return rewards

    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, model_init_kwargs={"dtype": "float32"},
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=48,
                      max_tool_calling_iterations=2, beta=0.0, learning_rate=1e-4, max_steps=2, logging_steps=1,
                      save_strategy="no", report_to=[], seed=0)
    try:
        trainer = GRPOTrainer(model=str(tool_model_dir), args=args, train_dataset=task_dataset(tasks),
                              reward_funcs=reward, environment_factory=environment_factory_for(tasks, host=host))
        trainer.train()
        assert host.open_sandboxes <= 4  # the last batch's, until the next reset or close
    finally:
        host.close()

    assert len(seen) == 8 and trainer.state.global_step == 2
    ran = [state for state, _ in seen if state.calls]
    assert ran, "the model called no tool in 8 rollouts"
    for state, value in seen:
        assert state.failure is None
        # an answer reached the host only through the sandbox: the `answer` command the bash call ran there
        assert value == (1.0 if state.answered and state.answer.strip() == "5" else 0.0)
        if state.answered:
            assert state.ended == "the answer was submitted"
    assert any(state.answered for state in ran)
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert [round(e["reward"], 4) for e in logged] == [round(sum(v for _, v in seen[i:i + 4]) / 4, 4) for i in (0, 4)]
    assert list(boxes.iterdir()) == [] and _live_processes_mentioning(str(boxes)) == []
